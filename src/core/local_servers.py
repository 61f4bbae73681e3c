"""MLflow's two servers on loopback, each started in its own process group, waited for with a
deadline and killed with its workers on exit: `mlflow server` (a tracking server on sqlite) and
`mlflow models serve` (a registered model). bench.gpu_check serves the model with them, and
the tests run the pipeline and the model against them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


class ServerDidNotStart(RuntimeError):
    """The server exited or did not answer in time; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(health_url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    """Until `health_url` answers 200; raises ServerDidNotStart with the end of the server's log
    if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(health_url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            why = "exited" if proc.poll() is not None else f"did not answer in {timeout_s:g} s"
            tail = log.read_text(errors="replace")[-2000:]
            raise ServerDidNotStart(f"{health_url} {why}: {tail}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """The whole process group (uvicorn's or gunicorn's workers too): SIGTERM with `grace_s` to
    go, then SIGKILL; 0 kills at once."""
    if proc.poll() is not None:
        return
    if grace_s > 0:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextmanager
def mlflow_server(workdir: Path, start_timeout_s: float = 90):
    """Yields (uri, stop): `stop()` kills the server and its workers (a server going away);
    it is called on exit whatever happens."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{workdir / 'server.db'}",
           "--artifacts-destination", str(workdir / "artifacts"), "--workers", "1"]
    log_path = workdir / "server.log"
    # No job runner: MLflow 3's server starts eight more processes for its GenAI jobs (prompt
    # optimisation, trace roll-ups), which nothing here uses, at about 22 CPU-seconds a start.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)
        uri = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(f"{uri}/health", proc, start_timeout_s, log_path)
            yield uri, lambda: _stop(proc, grace_s=20)
        finally:
            _stop(proc, grace_s=20)


@contextmanager
def model_server(model_uri: str, workdir: Path, env: dict[str, str],
                 start_timeout_s: float = 120, env_manager: str = "local"):
    """`mlflow models serve` of `model_uri` on loopback, one worker, in `workdir` with `env`
    over this process's environment; yields (base URL, path of its log). `env_manager` uv or
    virtualenv builds the model's own environment first (allow for it in `start_timeout_s`)."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri,
           "--env-manager", env_manager, "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    log_path = workdir / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env}, cwd=workdir)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(f"{url}/ping", proc, start_timeout_s, log_path)
            yield url, log_path
        finally:
            _stop(proc, grace_s=0)
