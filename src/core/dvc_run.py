"""What a stage learns from the DVC run around it: the `dvc` process that started it (to group
one repro's MLflow runs, and to stop training when that process is killed) and the hashes
dvc.lock records for its inputs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import yaml

from src.core import paths


def locked_outputs() -> dict[str, str]:
    """{path: md5} of every stage output recorded in dvc.lock."""
    lock = paths.ROOT / "dvc.lock"
    if not lock.exists():
        return {}
    try:
        stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    except yaml.YAMLError:
        return {}
    return {o["path"]: o.get("md5", "") for s in stages.values() for o in s.get("outs", [])}


def data_hashes(deps: list[Path]) -> dict[str, str]:
    """md5 of each input as recorded in dvc.lock (the outputs of upstream stages)."""
    known = locked_outputs()
    tags = {}
    for dep in deps:
        rel = os.path.relpath(dep, paths.ROOT)
        if rel in known:
            tags[f"data.{rel}"] = known[rel]
    return tags


def dvc_hash(path: Path) -> str | None:
    """The DVC hash of an upstream output, trusted only under `dvc repro` (which records it
    just before the next stage starts); a stage run by hand may read data newer than the lock.
    """
    if dvc_process() is None:
        return None
    md5 = locked_outputs().get(os.path.relpath(path, paths.ROOT))
    return md5.removesuffix(".dir") if md5 else None  # MLflow keeps 36 characters of digest


def dvc_process():
    """The `dvc` process this stage runs under (psutil.Process), or None."""
    try:
        import psutil

        proc = psutil.Process().parent()
        while proc is not None:
            argv = proc.cmdline()
            # `dvc …` as a script (python /…/bin/dvc) or binary, or `python -m dvc …`
            if any(Path(a).name == "dvc" for a in argv[:2]) or argv[1:3] == ["-m", "dvc"]:
                return proc
            proc = proc.parent()
    except Exception:  # psutil missing or a process vanished
        pass
    return None


def dvc_parent_gone() -> Callable[[], bool]:
    """A check for long loops: True once the `dvc` process that started this stage has ended.

    DVC does not pass a SIGTERM on to the stage it runs, so `kill <dvc pid>` left training
    going, unrecorded, and the next `dvc repro` trained beside it in the same checkpoint folder.
    Only a direct dvc parent counts: under torchrun the agent is the parent and stops ranks
    itself, and a stage started by hand may outlive its shell (nohup) on purpose.
    """
    proc = dvc_process()
    if proc is None or proc.pid != os.getppid():
        return lambda: False
    return lambda: os.getppid() != proc.pid
