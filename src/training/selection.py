"""Epoch selection: which epoch checkpoints to keep, best.pt, early stopping and averaging.

Epochs are ranked by the validation criterion (lower is better). Only the `train.average_best`
best epoch files stay on disk, and `model.pt` averages them, so no test sentence ever picks a
checkpoint. Order matters for a kill at any point: a new epoch file is written first, the new
ranking is saved in `last.pt` by the caller, and only then are dropped epochs deleted (`prune`).
Under data-parallel training every rank keeps the ranking (so all agree when to stop) and only
rank 0 (`write=True`) touches the files.
"""

from __future__ import annotations

from pathlib import Path

from src.core import failpoints
from src.nmt import checkpoint
from src.training.resume import TrainState


class EpochSelection:
    def __init__(self, ckpt_dir: Path, state: TrainState, average_best: int, patience: int,
                 write: bool = True):
        self.dir, self.state = Path(ckpt_dir), state
        self.average_best, self.patience, self.write = average_best, patience, write

    def epoch_file(self, epoch: int) -> Path:
        return self.dir / f"epoch{epoch + 1}.pt"

    def record(self, model, epoch: int, criterion: float) -> bool:
        """Save this epoch's weights and rank it; True if it is the best so far."""
        st = self.state
        improved = criterion < st.best_criterion
        if self.write:
            checkpoint.save(checkpoint.model_state(model), self.epoch_file(epoch))
            if improved:
                checkpoint.save(checkpoint.model_state(model), self.dir / "best.pt")
        failpoints.hit("after_epoch_checkpoint")
        st.epoch_criteria[epoch] = criterion
        ranked = sorted(st.epoch_criteria, key=st.epoch_criteria.get)[: self.average_best]
        st.epoch_criteria = {e: st.epoch_criteria[e] for e in ranked}
        st.best_criterion = min(st.best_criterion, criterion)
        st.bad_epochs = 0 if improved else st.bad_epochs + 1
        return improved

    def prune(self) -> None:
        """Delete epoch files the saved ranking no longer holds (call after saving last.pt)."""
        if not self.write:
            return
        keep = {self.epoch_file(e).name for e in self.state.epoch_criteria}
        for path in self.dir.glob("epoch*.pt"):
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def patience_spent(self) -> bool:
        return bool(self.patience) and self.state.bad_epochs >= self.patience

    def averaged_weights(self) -> tuple[dict, list[int]]:
        """Mean of the kept epochs' weights, best first, and their 1-based epoch numbers."""
        epochs = sorted(self.state.epoch_criteria, key=self.state.epoch_criteria.get)
        states = [checkpoint.load(self.epoch_file(e))["model"] for e in epochs]
        return checkpoint.average_state_dicts(states), [e + 1 for e in epochs]
