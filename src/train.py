"""train: data/tokenized + models/tokenizer -> models/model.pt (+ checkpoints, curves, reports).

Reads params `model.*` and `train.*`; the target language (for valid BLEU) and whether the
vocabulary is shared come from models/tokenizer/tokenizer.json. AdamW with linear warmup then
inverse-sqrt or cosine decay, label smoothing, gradient clipping and accumulation, token-count
batches, an optional training-time budget (`train.max_minutes`). After each epoch the valid split
is scored (loss, and greedy BLEU when `train.select_by: bleu`); that score drives early
stopping, best.pt and which epochs are averaged. After its first `train.log_every_steps` steps
the run prints how long it will take (the steps left at the pace so far, epochs in both
directions counted at their length, plus the validations, said again once the first is timed),
and every progress line gives the run's ETA beside the epoch's. Every `checkpoint_every_steps`
and at each epoch end `models/checkpoints/last.pt` (weights, optimizer, scheduler, step, RNG)
is written atomically, and a Ctrl-C or SIGTERM writes it at the step it stops after, so a
stopped or killed run resumes where it stopped when started again with the same params and
data. The final `models/model.pt` averages the `train.average_best` best epoch checkpoints (by the
selection score), so no test sentence ever picks a checkpoint. Its valid BLEU, the
training minutes and tokens/s are the DVC metrics (models/train_metrics.json); the rest of the
summary goes to models/train_stats.json, and MLflow gets both plus CPU/memory system metrics.

With `train.nproc_per_node` > 1 (or under torchrun) it trains data-parallel (DDP): every rank
builds the same batches and takes its share of each optimizer step, the loss is normalised by
the target tokens of the whole global step (so N ranks with batch B match one process with B
and accumulation N), rank 0 alone validates and writes, and every rank resumes from last.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from src.core import paths
from src.core.cli import run_cli
from src.core.errors import require_file
from src.core.params import FinetuneParams, ModelParams, TrainParams, load_params
from src.training.host_memory import use_allocator
from src.training.init_from import finetune_recipe

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    data_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded splits from `tokenize`."),
    tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer from `tokenize`."),
    ckpt_dir: Path = typer.Option(paths.CHECKPOINTS, help="Resumable checkpoints dir."),
    model_out: Path = typer.Option(paths.MODELS / "model.pt", help="Final model to write."),
    metrics: Path = typer.Option(paths.TRAIN_METRICS, help="Headline JSON (DVC metrics)."),
    stats: Path = typer.Option(paths.TRAIN_STATS, help="Everything about the run, JSON."),
    checkpoint_every_steps: int = typer.Option(500, min=1, help="Save last.pt this often."),
    parent_dir: Path = typer.Option(paths.PARENT, help="The parent stage's folder: with "
                                    "train.init_from set, training starts from its model.pt."),
) -> None:
    """Train the Transformer (params `model.*`, `train.*`). A killed run resumes exactly from
    models/checkpoints/last.pt; a change of params that shape training moves old checkpoints
    aside (never deletes them), while threads, logging, patience and budgets may change freely.

    With `train.nproc_per_node` N > 1 it starts N data-parallel ranks on this machine (as
    `torchrun --standalone --nproc_per_node N -m src.train` would); under torchrun across
    machines, set nothing: the ranks come from torchrun.

    With `train.init_from` set, training starts from that model's weights (models/parent/, from
    the parent stage) with a fresh optimizer and schedule, and `finetune.*` replaces train.lr,
    warmup_steps, epochs and bidirectional_epochs; the dims in params.yaml must be the model's."""
    model_params = load_params(ModelParams)
    cfg = finetune_recipe(load_params(TrainParams), load_params(FinetuneParams))
    require_file(data_dir, "tokenize")
    require_file(tokenizer_dir, "tokenize")
    # Only when this module is the program (python -m src.train, its torchrun ranks): a test
    # runner calling main() must not be replaced by a restarted process.
    allocator = use_allocator(cfg.allocator, sys.orig_argv if __name__ == "__main__" else None)
    # Imported only now: the restart onto tcmalloc above replaces this process, which would
    # import torch (about 1.5 s) all over again.
    from src.training import distributed
    from src.training.resume import note
    from src.training.stage import train

    if allocator.note and os.environ.get("RANK", "0") == "0":
        note(allocator.note)
    if cfg.nproc_per_node > 1 and not distributed.under_launcher():
        raise typer.Exit(distributed.launch(cfg.nproc_per_node, "src.train", sys.argv[1:]))
    world = distributed.init_world()
    try:
        train(world, model_params, cfg, data_dir, tokenizer_dir, ckpt_dir, model_out,
              (metrics, stats), checkpoint_every_steps, parent_dir)
    except Exception as exc:
        distributed.exit_if_peer_lost(world, exc)
        raise
    distributed.shutdown(world)


if __name__ == "__main__":
    run_cli(app)
