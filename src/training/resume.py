"""Resume state: what `models/checkpoints/last.pt` holds, and when it may be resumed.

A checkpoint records the params that shape the training trajectory and a digest of the data
it saw. A resumed run continues bit for bit where the killed one stopped (weights, optimizer,
scheduler, RNG, batch position). Knobs that do not change the trajectory — threads, logging,
patience, time/step/epoch budgets (with the inverse-sqrt schedule), how many epochs are
averaged — may change between runs: raising `train.epochs` or `train.max_minutes` continues a
stopped run. When a trajectory param or the data did change, the old checkpoints are never
deleted: the folder is moved aside (`checkpoints.old-<time>`) and stderr says which keys changed.
Under data-parallel training `last.pt` holds every rank's RNG state; the number of ranks may
change between runs (train says what that changes).
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from src.core.errors import PipelineError
from src.core.params import ModelParams, TrainParams
from src.nmt import checkpoint

# train.* keys that do not change which weights the run produces, step for step
FREE_TRAIN_KEYS = frozenset(
    {"threads", "log_every_steps", "max_minutes", "patience", "epochs", "max_steps",
     "average_best", "nproc_per_node", "allocator"}
)
# ... except that a cosine schedule decays over max_steps or epochs x steps per epoch
COSINE_HORIZON_KEYS = frozenset({"epochs", "max_steps"})


@dataclass
class TrainState:
    """Everything besides tensors that a resumed run must get back."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epoch in progress (0-based)
    batch_in_epoch: int = 0  # batches of `epoch` already consumed
    best_criterion: float = float("inf")  # lowest ValidScorer criterion so far
    bad_epochs: int = 0
    last_loss: float = float("nan")  # train loss of the latest step (for the epoch line)
    train_seconds: float = 0.0
    tokens_seen: int = 0
    threads: int = 0  # CPU threads of the run that wrote this state
    world_size: int = 1  # data-parallel ranks of the run that wrote this state
    epoch_criteria: dict[int, float] = field(default_factory=dict)  # kept epoch -> criterion
    curve: list[dict] = field(default_factory=list)
    valid_curve: list[dict] = field(default_factory=list)


def trajectory_params(model: ModelParams, train: TrainParams, precision: str
                      ) -> dict[str, object]:
    """The params a checkpoint must share with the current run to be resumed, flattened.

    `precision` is what `train.precision` resolved to here ("auto" means bf16 on one machine
    and fp32 on another, and a bf16 run continued in fp32 is another trajectory)."""
    free = FREE_TRAIN_KEYS - (COSINE_HORIZON_KEYS if train.schedule == "cosine" else set())
    flat = {f"model.{k}": v for k, v in model.model_dump().items()}
    flat.update({f"train.{k}": v for k, v in train.model_dump().items() if k not in free})
    flat["train.precision"] = precision
    return flat


def data_digest(*dirs: Path) -> str:
    """sha256 over the files of the tokenized data and the tokenizer (names and bytes)."""
    digest = hashlib.sha256()
    for data_dir in dirs:
        for path in sorted(Path(data_dir).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                digest.update(str(path.relative_to(data_dir)).encode())
                with path.open("rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
    return digest.hexdigest()


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def note(message: str) -> None:
    print(f"train: {message}", file=sys.stderr)


def past_caps(state: dict, caps: dict[str, int]) -> str:
    for key, cap in caps.items():
        if cap and state.get(key, 0) > cap:
            name = {"step": "train.max_steps", "epoch": "train.epochs"}.get(key, key)
            return f"it has trained past {name}={cap} ({key} {state[key]})"
    return ""


class ResumeStore:
    """`last.pt` in the checkpoint folder, for one set of trajectory params and data."""

    def __init__(self, ckpt_dir: Path, params: dict[str, object], data: str):
        self.dir, self.params, self.data = Path(ckpt_dir), params, data
        self.dir.mkdir(parents=True, exist_ok=True)
        # A kill during an atomic save leaves its temporary sibling behind; it is never needed.
        for stale in self.dir.glob(".*.tmp"):
            stale.unlink(missing_ok=True)

    @property
    def last(self) -> Path:
        return self.dir / "last.pt"

    def save(self, state: TrainState, model, rng: list[dict] | None = None, **tensors) -> None:
        """`rng`: every rank's generator states in rank order (default: this process's)."""
        checkpoint.save(
            checkpoint.model_state(model, **tensors, state=state.__dict__,
                                   rng=rng or [rng_state()],
                                   trajectory=self.params, data=self.data),
            self.last,
        )

    def load(self, caps: dict[str, int] | None = None) -> dict | None:
        """The checkpoint to resume, or None (nothing there, or moved aside as incompatible).

        `caps` ({"step": train.max_steps, "epoch": train.epochs}, 0 = none): a checkpoint
        already past a lowered cap cannot give the run that cap asks for, so it is set aside.
        """
        if not self.last.exists():
            if any(self.dir.glob("*.pt")):
                self.set_aside("it has epoch checkpoints but no last.pt")
            return None
        try:
            ckpt = checkpoint.load(self.last)
        except PipelineError as exc:
            raise PipelineError(f"{exc}; move {self.dir} away to train from scratch") from None
        reason = self.mismatch(ckpt) or past_caps(ckpt["state"], caps or {})
        if reason:
            self.set_aside(reason)
            return None
        return ckpt

    def mismatch(self, ckpt: dict) -> str:
        old = ckpt.get("trajectory")
        if not isinstance(old, dict) or "state" not in ckpt:
            return "it was written by an older version of train"
        changed = [
            f"{key} {old.get(key, '(unset)')!r} -> {value!r}"
            for key, value in self.params.items() if old.get(key) != value
        ]
        changed += [f"{key} removed" for key in old if key not in self.params]
        if changed:
            return "params changed: " + ", ".join(changed)
        if ckpt.get("data") != self.data:
            return "the tokenized data or the tokenizer changed"
        known = {f.name for f in fields(TrainState)}
        if set(ckpt["state"]) - known:
            return "it was written by another version of train"
        return ""

    def set_aside(self, reason: str) -> None:
        """Move every checkpoint to a sibling folder; training then starts afresh."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.dir.with_name(f"{self.dir.name}.old-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.dir.with_name(f"{self.dir.name}.old-{stamp}-{n}")
        self.dir.rename(aside)
        self.dir.mkdir(parents=True)
        note(f"{self.dir} cannot be resumed ({reason}); moved it to {aside} and "
             "starting afresh")
