"""train: data/tokenized + models/tokenizer -> models/model.pt (+ checkpoints, curves, reports).

Reads params `model.*` and `train.*`; the target language (for valid BLEU) and whether the
vocabulary is shared come from models/tokenizer/tokenizer.json. AdamW with linear warmup then
inverse-sqrt or cosine decay, label smoothing, gradient clipping and accumulation, token-count
batches, an optional training-time budget (`train.max_minutes`). After each epoch the valid split
is scored (loss, and greedy BLEU when `train.select_by: bleu`); that score drives early
stopping, best.pt and which epochs are averaged. Every `checkpoint_every_steps` and at each epoch
end `models/checkpoints/last.pt` (weights, optimizer, scheduler, step, RNG) is written
atomically, and a Ctrl-C or SIGTERM writes it at the step it stops after, so a stopped or
killed run resumes where it stopped when started again with the same params and data. The
final `models/model.pt` averages the `train.average_last` best epoch checkpoints (by the
selection score), so no test sentence ever picks a checkpoint. Its valid BLEU, the
training minutes and tokens/s are the DVC metrics (models/train_metrics.json); the rest of the
summary goes to models/train_stats.json, and MLflow gets both plus CPU/memory system metrics.

With `train.nproc_per_node` > 1 (or under torchrun) it trains data-parallel (DDP): every rank
builds the same batches and takes its share of each optimizer step, the loss is normalised by
the target tokens of the whole global step (so N ranks with batch B match one process with B
and accumulation N), rank 0 alone validates and writes, and every rank resumes from last.pt.
"""

from __future__ import annotations

import csv
import math
import random
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from src import checkpoint, distributed, errors, failpoints, paths, tracking
from src.atomic import atomic_path
from src.augment import Segmentations, TrainingCorpus, drop_target_words
from src.batching import (
    Batch,
    batches_per_step,
    load_encoded,
    make_batch,
    rank_share,
    steps_in_epoch,
    token_batches,
)
from src.distributed import World
from src.errors import PipelineError, require_file, run_cli
from src.host_memory import keep_freed_memory
from src.model import Transformer, count_parameters, model_config
from src.params import ModelParams, TrainParams, load_params
from src.precision import Precision, resolve_precision
from src.reports import TRAIN_HEADLINE, write_report
from src.resume import (
    ResumeStore,
    TrainState,
    data_digest,
    note,
    rng_state,
    set_rng_state,
    trajectory_params,
)
from src.selection import EpochSelection
from src.subword import PAD, check_encoded_with, load_tokenizers
from src.validation import ValidScorer, token_loss, validation_bleu

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def lr_factor(step: int, cfg: TrainParams, total_steps: int) -> float:
    """Multiplier of `train.lr` at optimizer step `step` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(max(cfg.warmup_steps, 1) / (step + 1)) if cfg.warmup_steps else 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def training_corpus(data_dir: Path, cfg: TrainParams, tokenizers) -> TrainingCorpus:
    """The train split's ids, and with subword sampling each sentence's segmentations."""
    if cfg.bidirectional_epochs and not tokenizers.shared_vocab:
        raise PipelineError("train.bidirectional_epochs needs one vocabulary for both sides: "
                            "set tokenize.shared_vocab: true, or train.bidirectional_epochs: 0")
    corpus = TrainingCorpus(load_encoded(data_dir, "train"), cfg.seed, cfg.concat_ratio,
                            cfg.subword_alpha, bidirectional_epochs=cfg.bidirectional_epochs)
    if cfg.subword_alpha > 0:
        from datasets import load_from_disk

        part = load_from_disk(str(data_dir))["train"]
        corpus.candidates = (Segmentations.of(tokenizers.source, list(part["source"])),
                             Segmentations.of(tokenizers.target, list(part["target"])))
    return corpus


def write_curve(path: Path, rows: list[dict]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


class SmoothedLoss(torch.nn.Module):
    """The training loss as one module call: DDP syncs gradients of what its forward ran."""

    def __init__(self, model: Transformer, label_smoothing: float, rdrop_alpha: float = 0.0):
        super().__init__()
        self.model, self.label_smoothing, self.rdrop_alpha = model, label_smoothing, rdrop_alpha

    def forward(self, src, tgt_in, tgt_out) -> torch.Tensor:
        return token_loss(self.model, Batch(src, tgt_in, tgt_out), self.label_smoothing,
                          self.rdrop_alpha)[0]


class Trainer:
    def __init__(
        self,
        model: Transformer,
        cfg: TrainParams,
        device: torch.device,
        total_steps: int,
        store: ResumeStore,
        threads: int,
        world: World = World(),
        precision: Precision | None = None,
    ):
        precision = precision or resolve_precision(cfg.precision, device)[0]
        self.model, self.cfg, self.device, self.world = model, cfg, device, world
        self.loss = SmoothedLoss(model, cfg.label_smoothing, cfg.rdrop_alpha)
        if world.distributed:
            import inspect

            from torch.nn.parallel import DistributedDataParallel as DDP

            # The only buffer (the sinusoidal table) is equal everywhere: sync it at most once.
            # torch 2.13 renamed the knob and warns about the old name.
            no_resync = ({"forward_sync_buffers": False}
                         if "forward_sync_buffers" in inspect.signature(DDP).parameters
                         else {"broadcast_buffers": False})
            self.loss = DDP(self.loss, device_ids=[device.index] if device.type == "cuda"
                            else None, **no_resync)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=(0.9, 0.98),
            eps=1e-9,
            fused=True,  # one kernel over all tensors instead of ~10 ops per tensor
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, cfg, total_steps)
        )
        self.precision = precision
        self.scaler = torch.amp.GradScaler("cuda", enabled=precision.needs_scaler)
        self.store = store
        self.state = TrainState(threads=threads, world_size=world.size)

    # -- resume ----------------------------------------------------------------------------
    def save_last(self) -> None:
        """Every rank must call this (their RNG states are gathered); rank 0 writes."""
        rngs = self.world.gather(rng_state())
        if self.world.is_main:
            self.store.save(
                self.state,
                self.model,
                rng=rngs,
                optimizer=self.optimizer.state_dict(),
                scheduler=self.scheduler.state_dict(),
                scaler=self.scaler.state_dict(),
            )

    def try_resume(self) -> bool:
        # Rank 0 decides (and may set an incompatible folder aside); the others follow.
        caps = {"step": self.cfg.max_steps, "epoch": self.cfg.epochs}
        ckpt = self.store.load(caps=caps) if self.world.is_main else None
        if not self.world.from_main(ckpt is not None):
            return False
        if ckpt is None:
            ckpt = checkpoint.load(self.store.last)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        threads = self.state.threads
        self.state = TrainState(**ckpt["state"])
        rngs = ckpt["rng"] if isinstance(ckpt["rng"], list) else [ckpt["rng"]]
        say = print if self.world.is_main else (lambda *a, **k: None)
        say(f"train: resumed from {self.store.last} at step {self.state.step}, "
            f"epoch {self.state.epoch + 1}, batch {self.state.batch_in_epoch}")
        if len(rngs) == self.world.size:
            set_rng_state(rngs[self.world.rank])
        else:
            # Weights, optimizer, schedule and the position in the epoch carry over; each
            # rank's dropout stream cannot, so it is seeded from (seed, step, rank).
            set_rng_state(rngs[0])
            torch.manual_seed(self.cfg.seed + 1_000_003 * self.state.step + self.world.rank)
            if self.world.is_main:
                note(f"resumed with {self.world.size} ranks where last.pt was written by "
                     f"{len(rngs)}: from here a step takes "
                     f"{batches_per_step(self.cfg.accumulation_steps, self.world.size)} "
                     "batches and dropout is reseeded, so the run differs from one that kept "
                     "its world size")
        if self.state.threads and self.state.threads != threads and self.world.is_main:
            note(f"resumed with {threads} threads where the run so far used "
                 f"{self.state.threads}: the float sums may differ in the last bits")
        self.state.threads, self.state.world_size = threads, self.world.size
        return True

    # -- one optimizer step ------------------------------------------------------------------
    def step(self, batches: list[Batch], n_target: int | None = None) -> tuple[float, int]:
        """Accumulate gradients over `batches`, then one clipped optimizer step.

        `n_target`: target tokens of the whole global step (every rank's batches); the loss
        and tokens returned are the global ones too.
        """
        self.model.train()
        if n_target is None:
            n_target = sum(int((b.tgt_out != PAD).sum()) for b in batches)
        loss_sum, tokens = 0.0, 0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            # Ranks exchange gradients once per optimizer step, after its last micro-batch.
            last = i == len(batches) - 1
            no_sync = self.loss.no_sync() if self.world.distributed and not last else nullcontext()
            with no_sync:
                with self.precision.autocast():
                    tgt_in = drop_target_words(batch.tgt_in, self.cfg.target_word_dropout)
                    loss = self.loss(batch.src, tgt_in, batch.tgt_out)
                # Normalised by the target tokens of the whole global step, not per batch;
                # DDP averages over ranks, so the world size scales the mean back to the sum.
                self.scaler.scale(loss / max(n_target, 1) * self.world.size).backward()
            loss_sum += loss.item()
            tokens += batch.n_tokens
            failpoints.hit("during_step")
        loss_sum, tokens = self.world.sum([loss_sum, tokens])
        self.scaler.unscale_(self.optimizer)
        if self.cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss_sum / max(n_target, 1), int(tokens)


def progress_bar(show: bool = True) -> Progress:
    return Progress(
        TextColumn("[bold]train[/] epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn(
            "loss {task.fields[loss]:.3f} lr {task.fields[lr]:.2e} {task.fields[tps]:,.0f} tok/s"
        ),
        disable=not show,
    )


def run_training(
    trainer: Trainer,
    corpus: TrainingCorpus,
    score_valid: ValidScorer,
    run,
    max_positions: int,
    checkpoint_every_steps: int,
) -> EpochSelection:
    cfg, model, world = trainer.cfg, trainer.model, trainer.world
    st = trainer.state
    selection = EpochSelection(trainer.store.dir, st, cfg.average_last, cfg.patience,
                               write=world.is_main)
    selection.prune()  # a kill between saving last.pt and pruning leaves dropped epochs
    span = batches_per_step(cfg.accumulation_steps, world.size)
    dvc_gone = tracking.dvc_parent_gone()
    window_tokens, window_start = 0, time.perf_counter()
    with progress_bar(show=world.is_main) as bar:
        say = bar.console.print if world.is_main else (lambda *a, **k: None)
        task = bar.add_task("train", total=None, epoch=1, loss=0.0, lr=0.0, tps=0.0)
        while st.epoch < cfg.epochs and not stop_reason(cfg, st, selection):
            pairs = corpus.epoch(st.epoch)
            src_lens, tgt_lens = pairs.lengths()
            # what each sentence puts in tgt_out (clipped, + EOS): the loss normaliser of a step
            target_tokens = np.minimum(tgt_lens, max_positions - 1) + 1
            epoch_batches = token_batches(src_lens, tgt_lens, cfg.max_tokens, cfg.seed + st.epoch,
                                          length_multiple=cfg.length_multiple)
            usable = min(len(epoch_batches),
                         steps_in_epoch(len(epoch_batches), cfg.accumulation_steps,
                                        world.size) * span)
            bar.update(
                task,
                total=usable,
                completed=st.batch_in_epoch,
                epoch=f"{st.epoch + 1}/{cfg.epochs}",
            )
            step_start = time.perf_counter()
            # The budget is checked before a step, so a resumed run never takes one too many.
            while st.batch_in_epoch < usable and not out_of_budget(cfg, st):
                if dvc_gone():  # `kill <dvc pid>`: stop as the signal would have (checkpoint kept)
                    with saved_if_stopped(trainer, say):
                        errors.stop_as_if(signal.SIGTERM,
                                          "the dvc process running this stage ended")
                # A stop waits until the step, its logs and a periodic save are done, then
                # saves last.pt there (one_step)
                with one_step(trainer, say):
                    group = epoch_batches[st.batch_in_epoch : st.batch_in_epoch + span]
                    batches = [
                        make_batch([pairs.source(i) for i in idx],
                                   [pairs.target(i) for i in idx], max_positions,
                                   cfg.length_multiple)
                        for idx in rank_share(group, world.rank, world.size)
                    ]
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
                    if not math.isfinite(loss):
                        raise PipelineError(
                            f"training diverged at step {st.step} (loss {loss}); "
                            "lower train.lr or raise train.warmup_steps"
                        )
                    if st.step % cfg.log_every_steps == 0:
                        tps = window_tokens / max(now - window_start, 1e-9)
                        window_tokens, window_start = 0, now
                        st.curve.append({"step": st.step, "loss": round(loss, 4), "lr": lr,
                                         "tokens_per_s": round(tps, 1)})
                        run.log_metrics(
                            {"train_loss": loss, "lr": lr, "tokens_per_s": tps}, step=st.step
                        )
                        bar.update(task, tps=tps)
                    bar.update(task, completed=st.batch_in_epoch, loss=loss, lr=lr)
                    if st.step % checkpoint_every_steps == 0:
                        trainer.save_last()
                        failpoints.hit("after_periodic_save")
            failpoints.hit("before_validation")
            # Rank 0 scores the valid split; the others wait for its numbers. A stop here saves
            # the epoch's steps (validation changes no state), as one between steps does.
            with saved_if_stopped(trainer, say):
                valid = world.from_main(score_valid(model, trainer.device) if world.is_main
                                        else None)
            criterion = valid.pop("criterion")
            st.valid_curve.append(
                {"epoch": st.epoch + 1, "step": st.step}
                | {k: round(v, 4) for k, v in valid.items()}
            )
            run.log_metrics(valid | {"epoch": st.epoch + 1}, step=st.step)
            improved = selection.record(model, st.epoch, criterion)
            bleu_text = f", valid BLEU {valid['valid_bleu']:.2f}" if "valid_bleu" in valid else ""
            say(
                f"epoch {st.epoch + 1}: step {st.step}, train loss {st.last_loss:.3f}, "
                f"valid loss {valid['valid_loss']:.3f}{bleu_text}{' *' if improved else ''}, "
                f"{st.tokens_seen / max(st.train_seconds, 1e-9):,.0f} tok/s"
            )
            st.epoch += 1
            st.batch_in_epoch = 0
            trainer.save_last()
            failpoints.hit("after_epoch_save")
            selection.prune()
            reason = stop_reason(cfg, st, selection)
            if reason and st.epoch < cfg.epochs:
                say(f"stop: {reason}")
    return selection


def save_at_stop(trainer: Trainer, say) -> None:
    """Save last.pt for a stop between steps, where the state is complete: the same state a
    periodic save there holds, so the resumed run is still bit for bit the uninterrupted one.
    One process only: under DDP ranks may stop at different steps and saving gathers from all
    of them, so they resume from the last periodic save."""
    if trainer.world.distributed:
        return
    with errors.stops_deferred("last.pt is saved"):
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
    is done, then saves last.pt and stops, so a stop loses no finished step (it used to lose up
    to `--checkpoint-every-steps` of them). A second stop acts at once, mid-step, and saves
    nothing."""
    completed = False
    try:
        with errors.stops_deferred():
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


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


@app.command()
def main(
    data_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded splits from `tokenize`."),
    tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer from `tokenize`."),
    ckpt_dir: Path = typer.Option(paths.CHECKPOINTS, help="Resumable checkpoints dir."),
    model_out: Path = typer.Option(paths.MODELS / "model.pt", help="Final model to write."),
    metrics: Path = typer.Option(paths.TRAIN_METRICS, help="Headline JSON (DVC metrics)."),
    stats: Path = typer.Option(paths.TRAIN_STATS, help="Everything about the run, JSON."),
    checkpoint_every_steps: int = typer.Option(500, min=1, help="Save last.pt this often."),
) -> None:
    """Train the Transformer (params `model.*`, `train.*`). A killed run resumes exactly from
    models/checkpoints/last.pt; a change of params that shape training moves old checkpoints
    aside (never deletes them), while threads, logging, patience and budgets may change freely.

    With `train.nproc_per_node` N > 1 it starts N data-parallel ranks on this machine (as
    `torchrun --standalone --nproc_per_node N -m src.train` would); under torchrun across
    machines, set nothing: the ranks come from torchrun."""
    model_params = load_params(ModelParams)
    cfg = load_params(TrainParams)
    require_file(data_dir, "tokenize")
    require_file(tokenizer_dir, "tokenize")
    if cfg.nproc_per_node > 1 and not distributed.under_launcher():
        raise typer.Exit(distributed.launch(cfg.nproc_per_node, "src.train", sys.argv[1:]))
    world = distributed.init_world()
    try:
        train(world, model_params, cfg, data_dir, tokenizer_dir, ckpt_dir, model_out,
              (metrics, stats), checkpoint_every_steps)
    except Exception as exc:
        distributed.exit_if_peer_lost(world, exc)
        raise
    distributed.shutdown(world)


def train(
    world: World,
    model_params: ModelParams,
    cfg: TrainParams,
    data_dir: Path,
    tokenizer_dir: Path,
    ckpt_dir: Path,
    model_out: Path,
    reports: tuple[Path, Path],
    checkpoint_every_steps: int,
) -> None:
    metrics, stats = reports
    keep_freed_memory()
    threads = cfg.threads or world.default_threads()  # 0: resolved and recorded
    torch.set_num_threads(threads)
    set_seed(cfg.seed)
    device = world.device()
    tokenizers = load_tokenizers(tokenizer_dir)
    check_encoded_with(data_dir, tokenizer_dir)
    target_lang, shared_vocab = tokenizers.target_lang, tokenizers.shared_vocab
    corpus = training_corpus(data_dir, cfg, tokenizers)
    valid_data = tuple(side.tolist() for side in load_encoded(data_dir, "valid"))
    config = model_config(
        model_params, tokenizers.source_vocab, tokenizers.target_vocab, shared_vocab
    )
    model = Transformer(config).to(device)
    if world.distributed:
        torch.manual_seed(cfg.seed + world.rank)  # same initial weights, own dropout masks
    params = {"model": model_params.model_dump(), "train": cfg.model_dump()}

    def epoch_steps(epoch: int) -> int:
        n_batches = len(token_batches(*corpus.epoch(epoch).lengths(), cfg.max_tokens, cfg.seed,
                                      length_multiple=cfg.length_multiple))
        steps = steps_in_epoch(n_batches, cfg.accumulation_steps, world.size)
        if steps == 0:
            raise PipelineError(
                f"{n_batches} batches cannot give each of {world.size} ranks "
                f"{cfg.accumulation_steps} per step: lower train.max_tokens or the world size")
        return steps

    # the cosine horizon: bidirectional epochs hold twice the pairs, so count them apart
    # (epoch 0 last: the corpus keeps the epoch it built last, and training starts there)
    steps_per_epoch = epoch_steps(cfg.bidirectional_epochs)
    both_ways = min(cfg.bidirectional_epochs, cfg.epochs)
    steps_both_ways = epoch_steps(0) if both_ways else 0
    total_steps = cfg.max_steps or (steps_per_epoch * (cfg.epochs - both_ways)
                                    + steps_both_ways * both_ways)
    # The tokenizer's languages and shared_vocab are part of the data a checkpoint must match.
    # hashed once (it reads every byte of the data), then shared with the other ranks
    digest = world.from_main(data_digest(data_dir, tokenizer_dir) if world.is_main else None)
    precision, warning = resolve_precision(cfg.precision, device)
    if warning and world.is_main:
        note(warning)
    store = ResumeStore(ckpt_dir, trajectory_params(model_params, cfg, precision.name), digest)
    trainer = Trainer(model, cfg, device, total_steps, store, threads, world, precision)
    trainer.try_resume()
    score_valid = ValidScorer(valid_data, cfg.max_tokens, cfg.select_by, tokenizers, target_lang)
    n_params = count_parameters(model)
    global_batch = cfg.max_tokens * batches_per_step(cfg.accumulation_steps, world.size)
    if world.is_main:
        per_epoch = f"~{steps_per_epoch:,} steps/epoch"
        if both_ways:
            per_epoch = f"~{steps_both_ways:,} steps/epoch in both directions" + (
                f" for the first {both_ways}, then {per_epoch}" if both_ways < cfg.epochs else "")
        print(
            f"train: {n_params:,} parameters, {len(corpus.ids[0]):,} pairs, "
            f"{per_epoch} on {device}, {world.size} rank(s) x "
            f"{threads} threads; a step is up to {global_batch:,} tokens (train.max_tokens "
            f"{cfg.max_tokens:,} x accumulation {cfg.accumulation_steps} x {world.size} ranks); "
            f"{precision.name} ({precision.reason})"
        )
    opened = (tracking.stage_run("train", params, deps=[data_dir, tokenizer_dir],
                                 system_metrics=True)
              if world.is_main else nullcontext(tracking.NullRun()))
    with opened as run:
        run.log_datasets(data_dir, {"train": "training", "valid": "validation"})
        run.set_tags({"precision": precision.name})
        run.log_metrics({"n_parameters": n_params, "threads": threads,
                         "world_size": world.size, "global_batch_tokens": global_batch})
        selection = run_training(
            trainer, corpus, score_valid, run, model.max_positions, checkpoint_every_steps
        )
        if not world.is_main:
            return
        st = trainer.state
        weights, epochs = selection.averaged_weights()
        failpoints.hit("during_averaging")
        model.load_state_dict(weights)
        final_valid = score_valid(model, device)  # of the averaged model
        if "valid_bleu" not in final_valid:  # select_by loss: BLEU is still the headline
            final_valid["valid_bleu"] = validation_bleu(model, *valid_data, tokenizers,
                                                        target_lang)
        checkpoint.save(checkpoint.model_state(model, averaged_epochs=epochs), model_out)
        write_curve(metrics.with_name(paths.TRAIN_CURVE.name), st.curve)
        write_curve(metrics.with_name(paths.VALID_CURVE.name), st.valid_curve)
        summary = {
            "n_parameters": n_params,
            "steps": st.step,
            "epochs": st.epoch,
            "threads": threads,
            "world_size": world.size,
            "precision": precision.name,
            "global_batch_tokens": global_batch,
            "train_seconds": round(st.train_seconds, 1),
            "train_minutes": round(st.train_seconds / 60, 1),
            "tokens_per_s": round(st.tokens_seen / max(st.train_seconds, 1e-9), 1),
            "best_epoch_valid_" + cfg.select_by: round(abs(st.best_criterion), 4),
            "averaged_epochs": len(epochs),
        } | {"final_" + k: round(v, 4) for k, v in final_valid.items() if k != "criterion"}
        summary["valid_bleu"] = round(final_valid["valid_bleu"], 2)
        write_report(summary, stats, metrics, TRAIN_HEADLINE)
        # valid_bleu is the curve's name in MLflow; there the final model's is final_valid_bleu
        # precision is text: a tag (set at the start), not a metric
        run.log_metrics({k: v for k, v in summary.items() if k not in {"valid_bleu", "precision"}})
        run.log_artifact(model_out, "model")
    print("train: " + ", ".join(f"{k} {v}" for k, v in summary.items()))


if __name__ == "__main__":
    run_cli(app)
