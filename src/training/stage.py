"""The train stage's work, from encoded data to models/model.pt: the corpus and the model, the
step count of the schedule, resume, the epoch loop under an MLflow run, then the averaged model,
its valid score, the curves and the reports. Data-parallel ranks all run it; rank 0 alone
validates and writes."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from src.core import failpoints, paths, tracking
from src.core.errors import PipelineError
from src.core.params import ModelParams, TrainParams
from src.core.reports import TRAIN_HEADLINE, write_curve, write_report
from src.data.augment import Segmentations, TrainingCorpus
from src.data.batching import (
    batches_per_step,
    load_drawn_weight,
    load_encoded,
    steps_in_epoch,
    token_batches,
)
from src.data.subword import check_encoded_with, load_tokenizers
from src.nmt import checkpoint
from src.nmt.model import Transformer, count_parameters, model_config
from src.training.distributed import World
from src.training.epochs import run_training
from src.training.host_memory import allocator_in_use, keep_freed_memory
from src.training.init_from import check_dims, parent_record, parent_tags
from src.training.precision import resolve_precision
from src.training.resume import ResumeStore, data_digest, note, trajectory_params
from src.training.step import Trainer, set_seed
from src.training.validation import ValidScorer, validation_bleu


def training_corpus(data_dir: Path, cfg: TrainParams, tokenizers) -> TrainingCorpus:
    """The train split's ids, and with subword sampling each sentence's segmentations."""
    if cfg.bidirectional_epochs and not tokenizers.shared_vocab:
        raise PipelineError("train.bidirectional_epochs needs one vocabulary for both sides: "
                            "set tokenize.shared_vocab: true, or train.bidirectional_epochs: 0")
    corpus = TrainingCorpus(load_encoded(data_dir, "train"), cfg.seed, cfg.concat_ratio,
                            cfg.subword_alpha, bidirectional_epochs=cfg.bidirectional_epochs,
                            drawn_weight=load_drawn_weight(data_dir))
    if cfg.subword_alpha > 0:
        from datasets import load_from_disk

        part = load_from_disk(str(data_dir))["train"]
        corpus.candidates = (Segmentations.of(tokenizers.source, list(part["source"])),
                             Segmentations.of(tokenizers.target, list(part["target"])))
    return corpus


def start_from_parent(model: Transformer, model_params: ModelParams, cfg: TrainParams,
                      parent_dir: Path) -> tuple[dict | None, TrainParams]:
    """With train.init_from set: the parent's weights in `model` (dims checked), at step 0 only
    (a resume replaces them with last.pt's). Returns the parent's record (None without one) and
    the params a resume must match: a moved alias is another trajectory, so the weights' hash,
    not the URI, is the key."""
    parent = parent_record(parent_dir, cfg.init_from)
    if not parent:
        return None, cfg
    check_dims(model_params, parent["config"], cfg.init_from)
    model.load_state_dict(checkpoint.load(parent_dir / "model.pt")["model"])
    return parent, cfg.model_copy(update={"init_from": parent["sha256"]})


def train_curve_rows(st, lr: float) -> list[dict]:
    """The logged training curve, ending at the last step: a run shorter than
    `train.log_every_steps` (a smoke run) had none, and DVC warned of the empty file."""
    if st.step == 0 or (st.curve and st.curve[-1]["step"] == st.step):
        return st.curve
    overall = st.tokens_seen / max(st.train_seconds, 1e-9)
    return [*st.curve, {"step": st.step, "loss": round(st.last_loss, 4), "lr": lr,
                        "tokens_per_s": round(overall, 1)}]


@dataclass(frozen=True)
class Schedule:
    """The step counts the cosine horizon is set from: bidirectional epochs hold twice the
    pairs, so they are counted apart."""

    steps_per_epoch: int
    both_ways: int  # epochs in both directions
    steps_both_ways: int
    total_steps: int

    @classmethod
    def of(cls, corpus: TrainingCorpus, cfg: TrainParams, world_size: int) -> Schedule:
        def epoch_steps(epoch: int) -> int:
            n_batches = len(token_batches(*corpus.epoch(epoch).lengths(), cfg.max_tokens,
                                          cfg.seed, length_multiple=cfg.length_multiple))
            steps = steps_in_epoch(n_batches, cfg.accumulation_steps, world_size)
            if steps == 0:
                raise PipelineError(
                    f"{n_batches} batches cannot give each of {world_size} ranks "
                    f"{cfg.accumulation_steps} per step: lower train.max_tokens or the world "
                    "size")
            return steps

        # epoch 0 last: the corpus keeps the epoch it built last, and training starts there
        steps_per_epoch = epoch_steps(cfg.bidirectional_epochs)
        both_ways = min(cfg.bidirectional_epochs, cfg.epochs)
        steps_both_ways = epoch_steps(0) if both_ways else 0
        total = cfg.max_steps or (steps_per_epoch * (cfg.epochs - both_ways)
                                  + steps_both_ways * both_ways)
        return cls(steps_per_epoch, both_ways, steps_both_ways, total)

    def describe(self, epochs: int) -> str:
        per_epoch = f"~{self.steps_per_epoch:,} steps/epoch"
        if not self.both_ways:
            return per_epoch
        return f"~{self.steps_both_ways:,} steps/epoch in both directions" + (
            f" for the first {self.both_ways}, then {per_epoch}" if self.both_ways < epochs
            else "")


def finish(trainer: Trainer, selection, score_valid: ValidScorer, valid_data, tokenizers,
           cfg: TrainParams, model_out: Path, reports: tuple[Path, Path], run,
           facts: dict) -> dict:
    """After the last epoch, on rank 0: the averaged model scored on valid and saved, the
    curves, the reports and the MLflow metrics; returns the summary. `facts`: n_parameters,
    threads, world_size, precision, global_batch_tokens, allocator."""
    metrics, stats = reports
    model, st = trainer.model, trainer.state
    weights, epochs = selection.averaged_weights()
    failpoints.hit("during_averaging")
    model.load_state_dict(weights)
    final_valid = score_valid(model, trainer.device)  # of the averaged model
    if "valid_bleu" not in final_valid:  # select_by loss: BLEU is still the headline
        final_valid["valid_bleu"] = validation_bleu(model, *valid_data, tokenizers,
                                                    tokenizers.target_lang,
                                                    cfg.valid_max_length_ratio)
    checkpoint.save(checkpoint.model_state(model, averaged_epochs=epochs), model_out)
    write_curve(metrics.with_name(paths.TRAIN_CURVE.name),
                train_curve_rows(st, trainer.scheduler.get_last_lr()[0]))
    write_curve(metrics.with_name(paths.VALID_CURVE.name), st.valid_curve)
    summary = {
        "n_parameters": facts["n_parameters"],
        "steps": st.step,
        "epochs": st.epoch,
        "threads": facts["threads"],
        "world_size": facts["world_size"],
        "precision": facts["precision"],
        "allocator": facts["allocator"],
        "global_batch_tokens": facts["global_batch_tokens"],
        "train_seconds": round(st.train_seconds, 1),
        "train_minutes": round(st.train_seconds / 60, 1),
        "tokens_per_s": round(st.tokens_seen / max(st.train_seconds, 1e-9), 1),
        "best_epoch_valid_" + cfg.select_by: round(abs(st.best_criterion), 4),
        "averaged_epochs": len(epochs),
    } | {"final_" + k: round(v, 4) for k, v in final_valid.items() if k != "criterion"}
    summary["valid_bleu"] = round(final_valid["valid_bleu"], 2)
    write_report(summary, stats, metrics, TRAIN_HEADLINE)
    # valid_bleu is the curve's name in MLflow; there the final model's is final_valid_bleu
    # precision and allocator are text: tags (set at the start), not metrics
    run.log_metrics({k: v for k, v in summary.items()
                     if k not in {"valid_bleu", "precision", "allocator"}})
    run.log_artifact(model_out, "model")
    return summary


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
    parent_dir: Path = paths.PARENT,
) -> None:
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
    parent, cfg_for_resume = start_from_parent(model, model_params, cfg, parent_dir)
    if world.distributed:
        torch.manual_seed(cfg.seed + world.rank)  # same initial weights, own dropout masks
    params = {"model": model_params.model_dump(), "train": cfg.model_dump()}
    schedule = Schedule.of(corpus, cfg, world.size)
    # The tokenizer's languages and shared_vocab are part of the data a checkpoint must match.
    # hashed once (it reads every byte of the data), then shared with the other ranks
    digest = world.from_main(data_digest(data_dir, tokenizer_dir) if world.is_main else None)
    precision, warning = resolve_precision(cfg.precision, device)
    if warning and world.is_main:
        note(warning)
    store = ResumeStore(ckpt_dir, trajectory_params(model_params, cfg_for_resume,
                                                    precision.name), digest)
    trainer = Trainer(model, cfg, device, schedule.total_steps, store, threads, world,
                      precision)
    trainer.try_resume()
    score_valid = ValidScorer(valid_data, cfg.max_tokens, cfg.select_by, tokenizers, target_lang,
                              cfg.valid_max_length_ratio)
    n_params = count_parameters(model)
    allocator = allocator_in_use()
    global_batch = cfg.max_tokens * batches_per_step(cfg.accumulation_steps, world.size)
    if world.is_main:
        print(f"train: {n_params:,} parameters, {len(corpus.ids[0]):,} pairs, "
              f"{schedule.describe(cfg.epochs)} on {device}, {world.size} rank(s) x "
              f"{threads} threads; a step is up to {global_batch:,} tokens (train.max_tokens "
              f"{cfg.max_tokens:,} x accumulation {cfg.accumulation_steps} x {world.size} "
              f"ranks); {precision.name} ({precision.reason}); {allocator} malloc")
    opened = (tracking.stage_run("train", params, deps=[data_dir, tokenizer_dir],
                                 system_metrics=True)
              if world.is_main else nullcontext(tracking.NullRun()))
    with opened as run:
        run.log_datasets(data_dir, {"train": "training", "valid": "validation"})
        run.set_tags({"precision": precision.name, "allocator": allocator}
                     | parent_tags(parent))
        run.log_metrics({"n_parameters": n_params, "threads": threads,
                         "world_size": world.size, "global_batch_tokens": global_batch})
        selection = run_training(
            trainer, corpus, score_valid, run, model.max_positions, checkpoint_every_steps,
            (schedule.steps_both_ways, schedule.steps_per_epoch)
        )
        if not world.is_main:
            return
        summary = finish(trainer, selection, score_valid, valid_data, tokenizers, cfg,
                         model_out, reports, run, facts={
                             "n_parameters": n_params, "threads": threads,
                             "world_size": world.size, "precision": precision.name,
                             "global_batch_tokens": global_batch, "allocator": allocator})
    print("train: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
