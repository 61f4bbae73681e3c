"""The end of a `dvc repro` in MLflow: a small process that outlives the stages.

No stage knows whether it is the repro's last (DVC may run one stage or six), so a stage that
succeeds leaves its repro run RUNNING, and this watcher, started by the stage that created the
repro run, ends it FINISHED once the `dvc` process has exited: the repro run reads RUNNING
while any of its stages runs, and its end time and duration are the whole repro's. A stage
that fails or is stopped ends the repro run FAILED or KILLED itself; the watcher leaves such a
status alone.

Run as `python -m src.core.repro_watch <dvc pid> <run id> <tracking uri>`; it polls with psutil
and imports MLflow only when the repro is over, so it costs next to nothing while training runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# The folder holding this `src` package (tests run stages with NMT_ROOT elsewhere).
CODE_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.5
# After dvc exits, how long the watcher waits for a stage still closing its own run (a stage
# stopped with dvc closes its runs within seconds) before it ends the repro run anyway.
SETTLE_S = 60.0


def spawn(dvc_pid: int, run_id: str, tracking_uri: str) -> None:
    """Start the watcher detached (its own session, no stdio), so neither a Ctrl-C at the
    terminal nor the stage's exit ends it."""
    subprocess.Popen(
        [sys.executable, "-m", "src.core.repro_watch", str(dvc_pid), run_id, tracking_uri],
        cwd=CODE_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )


def wait_for_exit(pid: int, poll_s: float = POLL_S) -> None:
    import psutil

    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(poll_s)


def finish(client, run_id: str, settle_s: float = SETTLE_S, poll_s: float = POLL_S) -> str:
    """End the repro run FINISHED unless a stage ended it otherwise; return its final status.
    Waits (at most `settle_s`) while one of its stage runs is still RUNNING."""
    run = client.get_run(run_id)
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        children = client.search_runs([run.info.experiment_id],
                                      filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
        if all(c.info.status != "RUNNING" for c in children):
            break
        time.sleep(poll_s)
    status = client.get_run(run_id).info.status
    if status == "RUNNING":
        client.set_terminated(run_id, "FINISHED")
        return "FINISHED"
    return status


def main(argv: list[str]) -> None:
    dvc_pid, run_id, uri = int(argv[0]), argv[1], argv[2]
    wait_for_exit(dvc_pid)
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    for attempt in range(5):  # a store busy with the last stage's writes: try again
        try:
            finish(MlflowClient(tracking_uri=uri), run_id)
            return
        except Exception:
            time.sleep(2.0 * (attempt + 1))


if __name__ == "__main__":
    main(sys.argv[1:])
