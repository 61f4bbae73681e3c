"""How long the rest of a training run takes: the steps left (the epoch in progress, then each
later epoch's count, cut where `train.max_steps` or `train.max_minutes` ends the run) at the
seconds a step has taken, plus every validation left at the seconds one has taken; and the
durations as the log writes them ("3 h 41 min", "12 min", "2 min 05 s", "45 s"). Pure
arithmetic: the epoch loop measures the pace and prints the lines."""

from __future__ import annotations

import math
from dataclasses import dataclass


def duration(seconds: float) -> str:
    """A wait as a person reads it: seconds under a minute ("45 s"), minutes and seconds under
    ten minutes ("2 min 05 s"), then whole minutes ("12 min", "3 h 41 min"), each rounded to
    its last unit."""
    whole = int(max(seconds, 0.0) + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = (whole + 30) // 60
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def per_item(seconds: float) -> str:
    """A measured time per item: three digits under a minute ("0.79 s"), else a duration."""
    return f"{seconds:.3g} s" if seconds < 59.95 else duration(seconds)


@dataclass(frozen=True)
class Pace:
    """What this process has measured: `steps` optimizer steps in `seconds` (the training
    clock: periodic saves included, validation not) over `tokens` tokens, and `epoch_ends`
    epoch ends (validation, checkpoint saves, building the next epoch's batches) in
    `epoch_end_seconds`."""

    steps: int
    seconds: float
    tokens: int
    epoch_ends: int = 0
    epoch_end_seconds: float = 0.0

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(self.steps, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def seconds_per_validation(self) -> float | None:
        """None until an epoch end has been timed."""
        return self.epoch_end_seconds / self.epoch_ends if self.epoch_ends else None


@dataclass(frozen=True)
class Budget:
    """The budget that ends the run first: `steps` more steps, then it stops (`name` says
    which, as params.yaml spells it)."""

    steps: int
    name: str


def budget(step: int, train_seconds: float, max_steps: int, max_minutes: float,
           seconds_per_step: float) -> Budget | None:
    """The step or time budget that binds first, None without one (0 is no budget in
    params). The time budget is checked before each step, so every step that starts inside it
    counts: ceil(seconds left / seconds per step)."""
    caps = []
    if max_steps:
        caps.append(Budget(max(max_steps - step, 0), f"train.max_steps {max_steps:,}"))
    if max_minutes:
        seconds_left = 60 * max_minutes - train_seconds
        caps.append(Budget(max(math.ceil(seconds_left / max(seconds_per_step, 1e-9)), 0),
                           f"train.max_minutes {max_minutes:g}"))
    return min(caps, key=lambda cap: cap.steps, default=None)


def epoch_steps_left(epoch: int, steps_left_in_epoch: int, epochs: int, both_ways: int,
                     steps_both_ways: int, steps_one_way: int) -> list[int]:
    """Steps still to take in `epoch` (0-based, in progress), then in each later epoch below
    `epochs`: the first `both_ways` epochs also hold every pair reversed (`steps_both_ways`
    steps each), the others `steps_one_way`."""
    later = [steps_both_ways if e < both_ways else steps_one_way
             for e in range(epoch + 1, epochs)]
    return [steps_left_in_epoch, *later]


@dataclass(frozen=True)
class WorkLeft:
    steps: int
    epochs: int  # epochs begun, the one in progress first: each ends in a validation
    this_epoch: int  # of `steps`, those of the epoch in progress
    cut_by: str = ""  # the budget that ends the run before its last epoch's end ("": none)


def work_left(epoch_steps: list[int], cap: Budget | None) -> WorkLeft:
    """The steps and epochs left of `epoch_steps` (as `epoch_steps_left` lists them) under the
    budget `cap` (None: none). As the loop runs: the epoch in progress is always validated, a
    later epoch begins only while the budget has steps left, and an epoch the budget cuts
    short is validated too."""
    limit = None if cap is None else cap.steps
    steps = epochs = 0
    for n in epoch_steps:
        if epochs and limit is not None and steps >= limit:
            break
        steps += n
        epochs += 1
    if limit is None:
        return WorkLeft(steps, epochs, epoch_steps[0])
    cut = steps > limit or epochs < len(epoch_steps)
    return WorkLeft(min(steps, limit), epochs, min(epoch_steps[0], limit),
                    cap.name if cut else "")


@dataclass(frozen=True)
class RunEstimate:
    """What is left of a run and how long it takes. `validations`: each epoch's left and the
    averaged model's at the end, each taking the measured epoch end (None: none timed yet, so
    `seconds` holds the steps only)."""

    work: WorkLeft
    pace: Pace
    first_epoch: int  # 1-based, the epoch in progress

    @property
    def validations(self) -> int:
        return self.work.epochs + 1

    @property
    def step_seconds(self) -> float:
        return self.work.steps * self.pace.seconds_per_step

    @property
    def validation_seconds(self) -> float | None:
        each = self.pace.seconds_per_validation
        return None if each is None else self.validations * each

    @property
    def seconds(self) -> float:
        return self.step_seconds + (self.validation_seconds or 0.0)

    def eta(self) -> str:
        """The run's ETA on a progress line, saying when validation is not in it yet."""
        return duration(self.seconds) + (" + validations" if self.validation_seconds is None
                                         else "")

    def epoch_eta(self) -> str:
        """The steps left in the epoch in progress, at the run's pace: never more than the
        run's ETA beside it."""
        return duration(self.work.this_epoch * self.pace.seconds_per_step)

    def line(self, both_ways: int, patience: int = 0) -> str:
        """The run's estimate in words: the epochs it covers (the run's first `both_ways` in
        both directions), its steps at the measured pace, its validations (timed or not yet),
        and what ends the run or may end it sooner."""
        last = self.first_epoch + self.work.epochs - 1
        span = (f"epoch {last}" if last == self.first_epoch
                else f"epochs {self.first_epoch}-{last}")
        if self.first_epoch <= both_ways:
            until = min(both_ways, last)
            span += (" (both ways)" if until == last
                     else f" (epoch {until} both ways)" if until == self.first_epoch
                     else f" ({self.first_epoch}-{until} both ways)")
        if self.work.cut_by:
            span += f", where {self.work.cut_by} ends the run"
        pace, each = self.pace, self.pace.seconds_per_validation
        validations = (f"{self.validations} validations at {per_item(each)} each as timed so far "
                       "(each epoch's with its saves, and the averaged model's)"
                       if each is not None else
                       f"{self.validations} validations, not timed yet (an updated estimate "
                       "follows the first)")
        sooner = f"; train.patience {patience} may stop it sooner" if patience else ""
        return (f"train: run estimate: {self.eta()} left for {span}: "
                f"{self.work.steps:,} steps at {per_item(pace.seconds_per_step)}/step "
                f"({pace.tokens_per_second:,.0f} tok/s, measured over {pace.steps:,} "
                f"step{'s' if pace.steps != 1 else ''}) "
                f"+ {validations}{sooner}")

