"""The MLflow seam: one context manager per stage execution, a no-op when tracking is off.

* Tracking URI: `MLFLOW_TRACKING_URI` wins; otherwise `sqlite:///<repo>/mlflow.db`, which is
  what `mlflow ui` opens by default when started at the repo root.
* Each stage execution is one run named after the stage, tagged with the git commit, the md5 of
  its data inputs from `dvc.lock`, and a `repro_id` shared by all stages of one `dvc repro`
  (derived from the dvc process that spawned them). The runs of one repro are nested under a
  parent run named `repro <time>`, so the UI shows them as one expandable group.
* `NMT_TRACKING=off` disables tracking (unit tests, quick local runs).
* The experiment is tagged as model training (`mlflow.experimentKind`). MLflow 3.17's UI
  still opens on the view its "GenAI / Model training" switch holds (GenAI by default, kept in
  the browser; `?workflowType=machine_learning` picks the runs table), so the README gives
  that link; the tag is what other MLflow versions and tools read.
* Each stage logs the data it read as MLflow dataset inputs (train/valid/test), with the DVC
  hash of that data as digest when it runs under DVC, so the runs table's Dataset column tells
  runs on different data apart. Training also samples CPU and memory as system metrics.
* Tracking is best effort: a locked sqlite file or a tracking-server blip is reported once per
  kind on stderr and the stage goes on (its files are the first copy of every result); a run
  that cannot even be opened falls back to no tracking, with a warning.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from src.core import cli, paths, repro_watch
from src.core.dvc_run import data_hashes, dvc_hash, dvc_process

EXPERIMENT = os.environ.get("NMT_EXPERIMENT", "nmt")


def enabled() -> bool:
    return os.environ.get("NMT_TRACKING", "on").lower() not in {"0", "off", "false", "no"}


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{paths.ROOT / 'mlflow.db'}"


class NullRun:
    """Stands in for a run when tracking is off: every call does nothing."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def log_artifacts(self, path: Path, artifact_path: str | None = None) -> None: ...
    def log_table(self, data: dict[str, list], artifact_file: str) -> None: ...
    def log_dict(self, data: dict, artifact_file: str) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_datasets(self, data_dir: Path, contexts: dict[str, str],
                     on_parent: bool = True) -> None: ...
    def log_sources(self, corpora: list[dict], context: str = "training") -> None: ...
    def log_model(self, log: Callable[[], str]) -> str | None: ...
    def describe_version(self, name: str, version: str, tags: dict[str, str],
                         description: str) -> None: ...

    @property
    def run_id(self) -> str | None:
        return None


_warned: set[str] = set()  # MLflow calls that failed already (warned once each)


def warn_once(what: str, exc: Exception) -> None:
    if what in _warned:
        return
    _warned.add(what)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    print(f"warning: MLflow {what} failed ({type(exc).__name__}: {first}); the stage goes on, "
          "its output files hold every result", file=sys.stderr)


PAUSE_AFTER_FAILURE_S = 60.0  # a run skips MLflow calls this long after one fails


def best_effort(method):
    """Run an MLflow call; on failure warn (once per method) and return None. A stop (Ctrl-C,
    SIGTERM) waits for the call to end: cut inside a write, it locks MLflow's SQLite store.

    After a failure the run pauses its MLflow calls for a minute, so a server that went away
    costs training one failed request per minute, not one per logged step.
    """

    @functools.wraps(method)
    def wrapper(run, *args, **kwargs):
        if time.monotonic() < getattr(run, "_paused_until", 0.0):
            return None
        try:
            with cli.stops_deferred(f"MLflow's {method.__name__}"):
                return method(run, *args, **kwargs)
        except Exception as exc:
            warn_once(method.__name__, exc)
            run._paused_until = time.monotonic() + PAUSE_AFTER_FAILURE_S
            return None

    return wrapper


# A tracking server that went away must not stall training for minutes: MLflow's defaults retry
# a failed request 7 times with exponential backoff. Users' own settings win.
MLFLOW_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    # Logging and registering the served model downloads artifacts six times, each drawing a
    # tqdm bar: noise in every export's log (nohup, CI, `dvc repro`).
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def apply_mlflow_defaults() -> None:
    """MLFLOW_DEFAULTS into the environment, where the user has not set them."""
    for key, value in MLFLOW_DEFAULTS.items():
        os.environ.setdefault(key, value)


class MlflowRun(NullRun):
    def __init__(self, client, run_id: str, parent_id: str | None = None):
        self._client = client
        self._run_id = run_id
        self._parent_id = parent_id

    @property
    def run_id(self) -> str:
        return self._run_id

    @best_effort
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import mlflow

        mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    @best_effort
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        import mlflow

        mlflow.log_artifact(str(path), artifact_path=artifact_path)

    @best_effort
    def log_artifacts(self, path: Path, artifact_path: str | None = None) -> None:
        import mlflow

        mlflow.log_artifacts(str(path), artifact_path=artifact_path)

    @best_effort
    def log_table(self, data: dict[str, list], artifact_file: str) -> None:
        import mlflow

        mlflow.log_table(data=data, artifact_file=artifact_file)

    @best_effort
    def log_dict(self, data: dict, artifact_file: str) -> None:
        import mlflow

        mlflow.log_dict(data, artifact_file)

    @best_effort
    def set_tags(self, tags: dict[str, str]) -> None:
        import mlflow

        mlflow.set_tags(tags)

    @best_effort
    def log_datasets(self, data_dir: Path, contexts: dict[str, str],
                     on_parent: bool = True) -> None:
        """Log parts of the DatasetDict at `data_dir` as dataset inputs, e.g.
        {"train": "training", "valid": "validation"}; the digest is the DVC hash of `data_dir`
        under `dvc repro`, else MLflow's own digest of the rows. With `on_parent`, the repro's
        parent run gets them too, so the runs table shows the data without expanding a repro.
        """
        import mlflow.data
        from datasets import load_from_disk
        from mlflow.entities import DatasetInput, InputTag

        splits = load_from_disk(str(data_dir))
        digest = dvc_hash(data_dir)
        inputs = []
        with warnings.catch_warnings():
            # MLflow registers its local-file source class twice, so resolving a file URI
            # warns "can be interpreted in multiple ways" on every call; both are the same
            warnings.filterwarnings("ignore", "The specified dataset source can be "
                                    "interpreted in multiple ways", UserWarning)
            for name, context in contexts.items():
                dataset = mlflow.data.from_huggingface(
                    splits[name], name=name, digest=digest,
                    source=Path(data_dir).resolve().as_uri())
                inputs.append(DatasetInput(dataset._to_mlflow_entity(),
                                           [InputTag("mlflow.data.context", context)]))
        for run_id in filter(None, (self._run_id, self._parent_id if on_parent else None)):
            self._client.log_inputs(run_id, datasets=inputs)

    @best_effort
    def log_sources(self, corpora: list[dict], context: str = "training") -> None:
        """Log each downloaded corpus (data/download.json's entries) as a dataset input named
        after it, whose source says where it came from: the Hub id, config, split and the
        commit read, or the URL; its digest is the sha256 of the TSV written. The repro's
        parent run gets them too, so the runs table's Dataset column tells two runs' data
        apart. A source's licence and attribution (a dictionary's, a wheel's) are tags of its
        input."""
        from mlflow.data.http_dataset_source import HTTPDatasetSource
        from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag

        inputs = []
        for corpus in corpora:
            if "hub" in corpus:
                hub = corpus["hub"]
                source = HuggingFaceDatasetSource(
                    hub["id"], config_name=hub.get("config") or "+".join(hub.get("configs", []))
                    or None, split=hub["split"], revision=hub["commit"])
            else:
                source = HTTPDatasetSource(corpus["urls"][0])
            dataset = MetaDataset(source, name=corpus["name"],
                                  digest=corpus["corpus_sha256"][:12])
            tags = [InputTag("mlflow.data.context", context)]
            if "license" in corpus:  # a licence that binds what is made of the data
                tags += [InputTag("license", corpus["license"]),
                         *([InputTag("attribution", corpus["attribution"])]
                           if "attribution" in corpus else [])]
            inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags))
        for run_id in filter(None, (self._run_id, self._parent_id)):
            self._client.log_inputs(run_id, datasets=inputs)

    @best_effort
    def log_model(self, log: Callable[[], str]) -> str | None:
        """Run `log`, which logs a model into this (active) run and registers it; returns the
        registered version, or None when the tracking store failed (best effort)."""
        return log()

    @best_effort
    def describe_version(self, name: str, version: str, tags: dict[str, str],
                         description: str) -> None:
        """Tags and description of a registered version (its lineage, as the UI shows it)."""
        for key, value in tags.items():
            self._client.set_model_version_tag(name, version, key, value)
        if description:
            self._client.update_model_version(name, version, description=description)


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} -> {'train.lr': 1}, the dotted names dvc.yaml uses."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=paths.ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def repro_id() -> str:
    """Same value for every stage of one `dvc repro`: the start time and pid of that dvc process.

    `NMT_REPRO_ID` overrides; outside DVC each run is its own group.
    """
    if os.environ.get("NMT_REPRO_ID"):
        return os.environ["NMT_REPRO_ID"]
    proc = dvc_process()
    if proc is not None:
        try:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(proc.create_time()))
            return f"{stamp}-{proc.pid}"
        except Exception:  # the dvc process vanished
            pass
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-manual"


def system_metrics_wanted() -> bool:
    """On unless MLflow's own switch, MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING, says otherwise."""
    value = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
    return value.strip().lower() not in {"0", "false", "off", "no"}


def _parent_run(client, experiment_id: str, group: str, tags: dict[str, str]) -> str:
    """The repro run of this group, RUNNING while a stage of it runs. Under `dvc repro` the
    first stage creates it and starts `repro_watch`, which ends it when dvc exits; stages leave
    it open on success (`_finish`). A group without a dvc process (`NMT_REPRO_ID`, a stage run
    by hand) is ended by each stage and marked RUNNING again by the next."""
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.repro_id = '{group}' and tags.kind = 'repro'"
    )
    if found:
        if found[0].info.status != "RUNNING":
            client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    run = client.create_run(
        experiment_id, run_name=f"repro {group}", tags={**tags, "kind": "repro", "repro_id": group}
    )
    dvc = dvc_process()
    if dvc is not None:
        repro_watch.spawn(dvc.pid, run.info.run_id, tracking_uri())
    return run.info.run_id


@contextmanager
def stage_run(stage: str, params: dict[str, Any], deps: list[Path] = (),
              system_metrics: bool = False) -> Iterator[NullRun]:
    """Open the MLflow run of one stage execution; it ends FINISHED, FAILED if the stage
    raises, or KILLED if it is interrupted (Ctrl-C, SIGTERM); its repro run ends the same way.

    `system_metrics`: sample CPU and memory into the run (unless switched off by
    MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false). If the tracking store cannot be opened, the
    stage runs untracked (with a warning).
    """
    if not enabled():
        yield NullRun()
        return
    opened = None
    status = "FAILED"
    try:
        with cli.stops_deferred("opening the MLflow run"):  # a stop then acts, below
            try:
                opened = _open_run(stage, params, deps,
                                   system_metrics and system_metrics_wanted())
            except Exception as exc:
                warn_once("tracking", exc)
        if opened is None:
            yield NullRun()
        else:
            client, run, parent = opened
            yield MlflowRun(client, run.info.run_id, parent)
        status = "FINISHED"
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cli.Terminated): stopped, not broken
        status = "KILLED"
        raise
    finally:
        if opened is not None:
            import mlflow

            _finish(mlflow, client, parent, status)


# What this experiment is for, in MLflow 3's terms (see the module docstring for the UI).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def _open_run(stage: str, params: dict[str, Any], deps: list[Path], system_metrics: bool):
    import logging

    import mlflow
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    apply_mlflow_defaults()
    local_store = not os.environ.get("MLFLOW_TRACKING_URI")  # set_tracking_uri exports it
    mlflow.set_tracking_uri(tracking_uri())
    client = MlflowClient()
    if local_store and mlflow.get_experiment_by_name(EXPERIMENT) is None:
        # The local store's artifacts belong beside its mlflow.db; MLflow's default is
        # ./mlruns under whatever directory the first stage happened to run from.
        mlflow.create_experiment(EXPERIMENT,
                                 artifact_location=(paths.ROOT / "mlruns").resolve().as_uri(),
                                 tags=EXPERIMENT_KIND)
    experiment = mlflow.set_experiment(EXPERIMENT)
    for key, value in EXPERIMENT_KIND.items():
        if experiment.tags.get(key) != value:  # created by a server, or by an older version
            client.set_experiment_tag(experiment.experiment_id, key, value)
    group = repro_id()
    commit = git_commit()
    tags = {"stage": stage, "git_commit": commit, "repro_id": group, "kind": "stage"}
    tags.update(data_hashes(list(deps)))
    parent = _parent_run(client, experiment.experiment_id, group, {"git_commit": commit})
    tags["mlflow.parentRunId"] = parent
    run = mlflow.start_run(run_name=stage, tags=tags, log_system_metrics=system_metrics)
    flat = flatten(params)
    if flat:
        try:
            mlflow.log_params(flat)
        except Exception as exc:
            warn_once("log_params", exc)
    return client, run, parent


def _finish(mlflow, client, parent: str, status: str) -> None:
    """End the stage's run, then its repro run unless the stage succeeded under dvc (then
    `repro_watch` ends it with the repro); a stop arriving meanwhile waits for both."""
    with cli.stops_deferred("closing the MLflow runs"):
        try:
            mlflow.end_run(status)
        except Exception as exc:
            warn_once("end_run", exc)
        if status == "FINISHED" and dvc_process() is not None:
            return
        try:
            client.set_terminated(parent, status)
        except Exception as exc:
            warn_once("end_run of the repro run", exc)
