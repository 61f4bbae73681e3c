"""Checkpoints: atomic save, clear errors on corrupt files, and weight averaging.

A checkpoint is a dict with `model` (state_dict), `config` (the `ModelConfig` as a plain dict)
and, for training checkpoints, optimizer/scheduler state, step, epoch and RNG states. Files are
read with `weights_only=True`: tensors and plain containers only, so a crafted `.pt` cannot run
code when it is loaded.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from src.core.atomic import atomic_path
from src.core.errors import PipelineError
from src.nmt.model import ModelConfig, Transformer


def model_state(model: Transformer, **extra) -> dict:
    """The weights and the config that rebuilds the network, plus any `extra` keys."""
    return {"model": model.state_dict(), "config": asdict(model.config), **extra}


def save(obj: dict, path: Path) -> None:
    # Through a file object: given a path, torch names the archive's inner folder after the
    # file, here a random temporary name, so equal weights would give files of other bytes
    # (and another hash in dvc.lock) on every run.
    with atomic_path(path) as tmp, tmp.open("wb") as fh:
        torch.save(obj, fh)


def load(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for truncated/garbled files
        raise PipelineError(f"corrupt checkpoint {path}: {type(exc).__name__}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise PipelineError(f"corrupt checkpoint {path}: missing model weights or config")
    return ckpt


def load_model(path: Path) -> tuple[Transformer, dict]:
    ckpt = load(path)
    try:
        model = Transformer(ModelConfig(**ckpt["config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, RuntimeError) as exc:
        raise PipelineError(
            f"checkpoint {path} does not match its config: {str(exc).splitlines()[0]}"
        ) from None
    return model.eval(), ckpt


def average_state_dicts(states: list[dict]) -> dict:
    """Element-wise mean of several state_dicts (checkpoint averaging, Vaswani et al. §6.1)."""
    avg = {}
    for key, value in states[0].items():
        if value.is_floating_point():
            avg[key] = sum(s[key].float() for s in states) / len(states)
        else:
            avg[key] = value
    return avg
