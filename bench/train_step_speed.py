"""Tokens/s of the train stage's own `Trainer.step` on the default recipe's batches, its levers
off or on, and (`--profile`) where its time goes: docs/training_speed.md,
docs/benchmarks/train_levers_epyc_zen5.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import typer

from bench import common
from src.core import paths
from src.core.params import ModelParams, TrainParams, load_params
from src.data.batching import make_batch, token_batches
from src.data.subword import load_tokenizers
from src.nmt.model import Transformer, model_config
from src.training import loss, validation
from src.training.host_memory import ALLOCATOR_CHOICES, allocator_in_use, use_allocator
from src.training.resume import ResumeStore
from src.training.stage import training_corpus
from src.training.step import Trainer, set_seed

app = common.cli_app()


def _projection_in_one_product(hidden, weight, labels, eps, rows=256):
    """The output projection as the fp32 step runs it: one (N, V) product, then the loss."""
    return loss.label_smoothed_cross_entropy(hidden @ weight.to(hidden.dtype).t(), labels, eps)


# The bf16 CPU step's levers that `--without` switches off, each measured alone against the
# step as shipped (docs/training_speed.md); the allocator is `--allocator system`.
LEVERS = {
    "packed-rows": lambda: mock.patch.object(Transformer, "packs_rows",
                                             lambda self, device: False),  # the (B, T) grid
    "chunked-loss": lambda: mock.patch.object(validation, "projected_cross_entropy",
                                              _projection_in_one_product),
}


# The same levers switched on where the step leaves them off (fp32), to measure what each
# would bring there (`--with`)
LEVERS_ON = {
    "packed-rows": lambda: mock.patch.object(
        Transformer, "packs_rows", lambda self, device: self.training and device.type == "cpu"),
    "chunked-loss": lambda: mock.patch.object(
        validation, "projects_in_chunks", lambda hidden: hidden.device.type == "cpu"),
}


@contextmanager
def levers_switched(off: list[str], on: list[str] = ()):
    with ExitStack() as stack:
        for name in off:
            stack.enter_context(LEVERS[name]())
        for name in on:
            stack.enter_context(LEVERS_ON[name]())
        yield


def run(precision: str, steps: int, warmup: int, epoch: int, profile: int, threads: int,
        overrides: dict, window: int = 0) -> dict:
    model_params = load_params(ModelParams)
    cfg = load_params(TrainParams).model_copy(update={"precision": precision} | overrides)
    torch.set_num_threads(threads)
    set_seed(cfg.seed)
    tokenizers = load_tokenizers(paths.TOKENIZER)
    corpus = training_corpus(paths.TOKENIZED, cfg, tokenizers)
    config = model_config(model_params, tokenizers.source_vocab, tokenizers.target_vocab,
                          tokenizers.shared_vocab)
    model = Transformer(config)
    pairs = corpus.epoch(epoch)
    src_lens, tgt_lens = pairs.lengths()
    order = token_batches(src_lens, tgt_lens, cfg.max_tokens, cfg.seed + epoch,
                          length_multiple=cfg.length_multiple)
    with tempfile.TemporaryDirectory() as tmp:
        store = ResumeStore(Path(tmp), {}, "")
        trainer = Trainer(model, cfg, torch.device("cpu"), 20_000, store, threads)
        batches = [make_batch([pairs.source(i) for i in idx], [pairs.target(i) for i in idx],
                              model.max_positions, cfg.length_multiple)
                   for idx in order[: warmup + max(steps, profile)]]
        for batch in batches[:warmup]:
            trainer.step([batch])
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                for batch in batches[warmup : warmup + profile]:
                    trainer.step([batch])
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        timed = batches[warmup : warmup + steps]
        start = time.perf_counter()
        tokens, windows = 0, []
        window_start, window_tokens = start, 0
        for i, batch in enumerate(timed, 1):
            step_tokens = trainer.step([batch])[1]
            tokens += step_tokens
            window_tokens += step_tokens
            if window and i % window == 0:  # a process that slows down shows it here
                now = time.perf_counter()
                windows.append(round(window_tokens / (now - window_start), 1))
                window_start, window_tokens = now, 0
        seconds = time.perf_counter() - start
    cells = sum(b.src.numel() + b.tgt_out.numel() for b in timed)
    real = sum(b.n_tokens for b in timed)
    shapes = {(tuple(b.src.shape), tuple(b.tgt_out.shape)) for b in timed}
    return {
        "precision": trainer.precision.name,
        "why": trainer.precision.reason,
        "tokens_per_s": round(tokens / seconds, 1),
        "steps": len(timed),
        "seconds": round(seconds, 1),
        "pad_share": round(1 - real / cells, 4),
        "distinct_shapes": len(shapes),
        "mean_tokens_per_step": round(float(np.mean([b.n_tokens for b in timed])), 1),
    } | ({f"tokens_per_s_by_{window}_steps": windows} if window else {})


@app.command()
def main(
    precision: list[str] = typer.Option(["fp32", "bf16"], help="Precisions to time in turn."),
    steps: int = typer.Option(150, help="Timed steps."),
    warmup: int = typer.Option(20, help="Untimed steps first."),
    epoch: int = typer.Option(10, help="Epoch whose batches are used (0-based)."),
    profile: int = typer.Option(0, help="Also profile this many steps (top ops by self time)."),
    threads: int = typer.Option(2, help="torch threads."),
    length_multiple: int = typer.Option(-1, help="Override train.length_multiple (-1: keep)."),
    rounds: int = typer.Option(1, help="Alternate the precisions this many times."),
    window: int = typer.Option(0, min=0, help="Also tokens/s of every this many timed steps "
                               "(a process that slows down as it runs shows it); 0: off."),
    out: Path = typer.Option(None, help="Append the rows as JSON lines here."),
    allocator: str = typer.Option("auto", help="As train.allocator: auto | tcmalloc | system "
                                  "(auto and tcmalloc restart the script on tcmalloc)."),
    without: list[str] = typer.Option([], help="Switch a lever of the bf16 CPU step off, to "
                                      f"measure it alone: {' | '.join(LEVERS)} (repeatable)."),
    with_: list[str] = typer.Option([], "--with", help="Switch a lever on where the step leaves "
                                    f"it off (fp32): {' | '.join(LEVERS_ON)} (repeatable)."),
) -> None:
    overrides = {} if length_multiple < 0 else {"length_multiple": length_multiple}
    if allocator not in ALLOCATOR_CHOICES:
        raise typer.BadParameter(f"expected one of {', '.join(ALLOCATOR_CHOICES)}",
                                 param_hint="--allocator")
    for option, names, known in (("--without", without, LEVERS), ("--with", with_, LEVERS_ON)):
        common.chosen(",".join(names), known, option, "lever")
    use_allocator(allocator, sys.orig_argv)  # as the train stage does
    for _ in range(rounds):
        for name in precision:
            with levers_switched(without, with_):
                row = run(name, steps, warmup, epoch, profile, threads, overrides, window)
            row |= {"cpu": common.cpu_description(), "threads": threads,
                    "torch": torch.__version__, "epoch": epoch,
                    "allocator": allocator_in_use(), "without": without,
                    "with": with_} | overrides
            print(json.dumps(row))
            if out:
                with out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    common.run_cli(app)
