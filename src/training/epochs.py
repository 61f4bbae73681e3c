"""The epoch loop: batches each epoch, steps, logs the curve and the run's estimate, validates
after every epoch, records the epoch for selection, and stops on the epoch count,
`train.patience` or a budget. A Ctrl-C or SIGTERM waits for the step it arrives in and saves
last.pt there, so a stopped run resumes bit for bit."""

from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from src.core import cli, dvc_run, failpoints
from src.core.errors import PipelineError
from src.core.params import TrainParams
from src.data.augment import TrainingCorpus
from src.data.batching import (
    batches_per_step,
    make_batch,
    rank_share,
    steps_in_epoch,
    token_batches,
)
from src.training.estimate import Pace, RunEstimate, budget, epoch_steps_left, work_left
from src.training.resume import TrainState
from src.training.selection import EpochSelection
from src.training.step import Trainer
from src.training.validation import ValidScorer


def progress_bar(show: bool = True) -> Progress:
    """The epoch's bar, drawn only on a terminal: elsewhere (nohup, CI, DVC) rich would still
    print its last state once at the end, a stale extra line; `progress_line` serves there."""
    console = Console(soft_wrap=True)
    return Progress(
        TextColumn("[bold]train[/] epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn(
            "loss {task.fields[loss]:.3f} lr {task.fields[lr]:.2e} {task.fields[tps]:,.0f} tok/s"
            " run ETA {task.fields[run_eta]}"
        ),
        disable=not (show and console.is_terminal),
        # A line printed to a file or pipe is never wrapped (rich wraps at 80 columns there),
        # so each epoch stays one line a log can be grepped by.
        console=console,
    )


def progress_line(step: int, epoch: str, done: int, usable: int, loss: float, tps: float,
                  epoch_eta: str, run_eta: str) -> str:
    """The line a log that is not a terminal gets every `train.log_every_steps` steps, where
    rich's bar shows nothing: step, loss, tokens/s, and the epoch's and the run's ETA."""
    return (f"train: step {step:,}, epoch {epoch} batch {done:,}/{usable:,}, loss {loss:.3f}, "
            f"{tps:,.0f} tok/s, epoch ETA {epoch_eta}, run ETA {run_eta}")


@dataclass
class RunClock:
    """This process's measurements behind the run's estimate: the step, training seconds and
    tokens it started at, and how long each epoch end it saw took (validation, the epoch's
    checkpoint saves, building the next epoch's batches).

    The pace is the mean over every step this process has taken, not a recent window: token
    batches of long and short sentences alternate, so a window of `log_every_steps` steps
    jumps by tens of percent from line to line, while the mean settles; a resumed run
    measures afresh (it may run on other threads or another machine)."""

    start: tuple[int, float, int]  # step, train_seconds, tokens_seen
    epoch_ends: list[float] = field(default_factory=list)
    announced: bool = False  # the estimate line is printed
    ended_at: float | None = None  # when the last epoch's training steps ended

    @classmethod
    def at(cls, st: TrainState) -> RunClock:
        return cls((st.step, st.train_seconds, st.tokens_seen))

    def pace(self, st: TrainState) -> Pace:
        step, seconds, tokens = self.start
        return Pace(st.step - step, st.train_seconds - seconds, st.tokens_seen - tokens,
                    len(self.epoch_ends), sum(self.epoch_ends))

    def estimate(self, cfg: TrainParams, st: TrainState, usable: int, span: int,
                 epoch_lengths: tuple[int, int]) -> RunEstimate:
        """What is left from here: the epoch in progress (`usable` batches, `span` a step),
        the later epochs at `epoch_lengths` steps (in both directions, in one), up to the
        epoch count or the budget that binds first."""
        pace = self.pace(st)
        cap = budget(st.step, st.train_seconds, cfg.max_steps, cfg.max_minutes,
                     pace.seconds_per_step)
        epochs = epoch_steps_left(st.epoch, math.ceil((usable - st.batch_in_epoch) / span),
                                  cfg.epochs, cfg.bidirectional_epochs, *epoch_lengths)
        return RunEstimate(work_left(epochs, cap), pace, st.epoch + 1)

    def epoch_began(self, cfg: TrainParams, st: TrainState, usable: int, span: int,
                    epoch_lengths: tuple[int, int]) -> str | None:
        """Times the epoch end just past (validation, saves, the next epoch's batches); the
        estimate line again once the first is timed, if it was printed without validation."""
        if self.ended_at is None:
            return None
        self.epoch_ends.append(time.perf_counter() - self.ended_at)
        if self.announced and len(self.epoch_ends) == 1:
            estimate = self.estimate(cfg, st, usable, span, epoch_lengths)
            return estimate.line(cfg.bidirectional_epochs, cfg.patience)
        return None

    def at_log_point(self, cfg: TrainParams, st: TrainState, usable: int, span: int,
                     epoch_lengths: tuple[int, int]) -> tuple[RunEstimate, str | None]:
        """The estimate now, and its line the first time this process has taken a log
        interval's steps."""
        estimate = self.estimate(cfg, st, usable, span, epoch_lengths)
        if self.announced or estimate.pace.steps < cfg.log_every_steps:
            return estimate, None
        self.announced = True
        return estimate, estimate.line(cfg.bidirectional_epochs, cfg.patience)


def run_training(
    trainer: Trainer,
    corpus: TrainingCorpus,
    score_valid: ValidScorer,
    run,
    max_positions: int,
    checkpoint_every_steps: int,
    epoch_lengths: tuple[int, int],
) -> EpochSelection:
    """`epoch_lengths`: the steps of an epoch in both directions and of one in one direction,
    as counted at start-up, for the run's estimate."""
    cfg, world, st = trainer.cfg, trainer.world, trainer.state
    selection = EpochSelection(trainer.store.dir, st, cfg.average_best, cfg.patience,
                               write=world.is_main)
    selection.prune()  # a kill between saving last.pt and pruning leaves dropped epochs
    span = batches_per_step(cfg.accumulation_steps, world.size)
    dvc_gone = dvc_run.dvc_parent_gone()
    window_tokens, window_start = 0, time.perf_counter()
    clock = RunClock.at(st)
    with progress_bar(show=world.is_main) as bar:
        say = bar.console.print if world.is_main else (lambda *a, **k: None)
        # nohup, CI, DVC: the bar draws nothing there, so a line every log_every_steps steps
        log_lines = world.is_main and not bar.console.is_terminal
        task = bar.add_task("train", total=None, epoch=1, loss=0.0, lr=0.0, tps=0.0,
                            run_eta="unknown")
        while st.epoch < cfg.epochs and not stop_reason(cfg, st, selection):
            pairs, target_tokens, epoch_batches, usable = epoch_plan(
                corpus, st.epoch, cfg, world.size, max_positions)
            if line := clock.epoch_began(cfg, st, usable, span, epoch_lengths):
                say(line)
            epoch_label = f"{st.epoch + 1}/{cfg.epochs}"
            bar.update(task, total=usable, completed=st.batch_in_epoch, epoch=epoch_label)
            step_start = time.perf_counter()
            # The budget is checked before a step, so a resumed run never takes one too many.
            while st.batch_in_epoch < usable and not out_of_budget(cfg, st):
                stop_if_dvc_gone(dvc_gone, trainer, say)
                # A stop waits until the step, its logs and a periodic save are done, then
                # saves last.pt there (one_step)
                with one_step(trainer, say):
                    group = epoch_batches[st.batch_in_epoch : st.batch_in_epoch + span]
                    batches = rank_batches(pairs, group, trainer, max_positions)
                    n_target = int(sum(target_tokens[idx].sum() for idx in group))
                    loss, tokens = trainer.step(batches, n_target)
                    st.batch_in_epoch += len(group)
                    st.step += 1
                    st.last_loss = loss
                    st.tokens_seen += tokens
                    window_tokens += tokens
                    now = time.perf_counter()
                    st.train_seconds += now - step_start
                    step_start = now
                    lr = trainer.scheduler.get_last_lr()[0]
                    check_finite(loss, st.step)
                    if st.step % cfg.log_every_steps == 0:
                        tps = window_tokens / max(now - window_start, 1e-9)
                        window_tokens, window_start = 0, now
                        st.curve.append({"step": st.step, "loss": round(loss, 4), "lr": lr,
                                         "tokens_per_s": round(tps, 1)})
                        run.log_metrics({"train_loss": loss, "lr": lr, "tokens_per_s": tps},
                                        step=st.step)
                        if world.is_main:
                            estimate, line = clock.at_log_point(cfg, st, usable, span,
                                                                epoch_lengths)
                            if line:
                                say(line)
                            bar.update(task, tps=tps, run_eta=estimate.eta())
                            if log_lines:
                                say(progress_line(st.step, epoch_label, st.batch_in_epoch,
                                                  usable, loss, tps, estimate.epoch_eta(),
                                                  estimate.eta()))
                    bar.update(task, completed=st.batch_in_epoch, loss=loss, lr=lr)
                    if st.step % checkpoint_every_steps == 0:
                        trainer.save_last()
                        failpoints.hit("after_periodic_save")
            clock.ended_at = time.perf_counter()
            end_epoch(trainer, score_valid, selection, run, say)
            reason = stop_reason(cfg, st, selection)
            if reason and st.epoch < cfg.epochs:
                say(f"stop: {reason}")
    return selection


def stop_if_dvc_gone(dvc_gone, trainer: Trainer, say) -> None:
    """`kill <dvc pid>`: stop as the signal would have (last.pt saved)."""
    if dvc_gone():
        with saved_if_stopped(trainer, say):
            cli.stop_as_if(signal.SIGTERM, "the dvc process running this stage ended")


def check_finite(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise PipelineError(f"training diverged at step {step} (loss {loss}); lower train.lr "
                            "or raise train.warmup_steps")


def rank_batches(pairs, group: list, trainer: Trainer, max_positions: int) -> list:
    """This rank's share of a step's batches (index lists), made into padded tensors."""
    cfg, world = trainer.cfg, trainer.world
    return [make_batch([pairs.source(i) for i in idx], [pairs.target(i) for i in idx],
                       max_positions, cfg.length_multiple)
            for idx in rank_share(group, world.rank, world.size)]


def epoch_plan(corpus: TrainingCorpus, epoch: int, cfg: TrainParams, world_size: int,
               max_positions: int):
    """An epoch's pairs, each sentence's loss tokens, its token batches and how many of them
    the ranks can use (whole steps only)."""
    pairs = corpus.epoch(epoch)
    src_lens, tgt_lens = pairs.lengths()
    # what each sentence puts in tgt_out (clipped, + EOS): the loss normaliser of a step
    target_tokens = np.minimum(tgt_lens, max_positions - 1) + 1
    epoch_batches = token_batches(src_lens, tgt_lens, cfg.max_tokens, cfg.seed + epoch,
                                  length_multiple=cfg.length_multiple)
    span = batches_per_step(cfg.accumulation_steps, world_size)
    usable = min(len(epoch_batches),
                 steps_in_epoch(len(epoch_batches), cfg.accumulation_steps, world_size) * span)
    return pairs, target_tokens, epoch_batches, usable


def end_epoch(trainer: Trainer, score_valid: ValidScorer, selection: EpochSelection, run,
              say) -> None:
    """Score the valid split, record the epoch for selection, save last.pt at the epoch's end."""
    st, world, model = trainer.state, trainer.world, trainer.model
    failpoints.hit("before_validation")
    # Rank 0 scores the valid split; the others wait for its numbers. A stop here saves
    # the epoch's steps (validation changes no state), as one between steps does.
    with saved_if_stopped(trainer, say):
        valid = world.from_main(score_valid(model, trainer.device) if world.is_main else None)
    criterion = valid.pop("criterion")
    st.valid_curve.append({"epoch": st.epoch + 1, "step": st.step}
                          | {k: round(v, 4) for k, v in valid.items()})
    run.log_metrics(valid | {"epoch": st.epoch + 1}, step=st.step)
    improved = selection.record(model, st.epoch, criterion)
    bleu_text = f", valid BLEU {valid['valid_bleu']:.2f}" if "valid_bleu" in valid else ""
    say(f"epoch {st.epoch + 1}: step {st.step}, train loss {st.last_loss:.3f}, "
        f"valid loss {valid['valid_loss']:.3f}{bleu_text}{' *' if improved else ''}, "
        f"{st.tokens_seen / max(st.train_seconds, 1e-9):,.0f} tok/s")
    st.epoch += 1
    st.batch_in_epoch = 0
    trainer.save_last()
    failpoints.hit("after_epoch_save")
    selection.prune()


def save_at_stop(trainer: Trainer, say) -> None:
    """Save last.pt for a stop between steps, where the state is complete: the same state a
    periodic save there holds, so the resumed run is still bit for bit the uninterrupted one.
    One process only: under DDP ranks may stop at different steps and saving gathers from all
    of them, so they resume from the last periodic save."""
    if trainer.world.distributed:
        return
    with cli.stops_deferred("last.pt is saved"):
        trainer.save_last()
    say(f"train: stopped at step {trainer.state.step}; saved {trainer.store.last}, "
        "run again to resume from there")


@contextmanager
def saved_if_stopped(trainer: Trainer, say):
    """For work that leaves the training state as it found it (validation, a check between
    steps): a stop inside the block saves last.pt first."""
    try:
        yield
    except KeyboardInterrupt:
        save_at_stop(trainer, say)
        raise


@contextmanager
def one_step(trainer: Trainer, say):
    """Around one training step and its bookkeeping: a Ctrl-C or SIGTERM waits until the block
    is done, then saves last.pt and stops, so a stop loses no finished step (rather than up to
    `--checkpoint-every-steps` of them since the last save). A second stop acts at once,
    mid-step, and saves nothing."""
    completed = False
    try:
        with cli.stops_deferred():
            yield
            completed = True
    except KeyboardInterrupt:
        if completed:
            save_at_stop(trainer, say)
        raise


def stop_reason(cfg: TrainParams, st: TrainState, selection: EpochSelection) -> str:
    """Why training should not start another epoch ("" to go on). Evaluated afresh on every
    start, so raising a budget or the patience continues a stopped run."""
    if selection.patience_spent():
        return f"no valid improvement in {cfg.patience} epochs (train.patience)"
    if out_of_budget(cfg, st):
        return "train.max_steps or train.max_minutes reached"
    return ""


def out_of_budget(cfg: TrainParams, st: TrainState) -> bool:
    """True once `train.max_steps` steps or `train.max_minutes` of training time are spent."""
    if cfg.max_steps and st.step >= cfg.max_steps:
        return True
    return bool(cfg.max_minutes) and st.train_seconds >= 60 * cfg.max_minutes
