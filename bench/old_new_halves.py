"""BLEU and chrF of models on the old half of the training pairs (the parent's) and the new
half, by evaluate's own search and scoring: docs/results.md,
docs/benchmarks/continuous_training.json.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch
import typer

from bench.common import cli_app, run_cli, write_json
from src.core.params import EvaluateParams, load_params
from src.data.subword import load_tokenizers
from src.evaluate import translate_and_score
from src.nmt import checkpoint

app = cli_app()


def halves(old_split: Path, full_split: Path, sample: int, seed: int) -> dict[str, list]:
    """{"old": [(source, target)], "new": [...]}: a seeded sample of each half's pairs."""
    from datasets import load_from_disk

    old = load_from_disk(str(old_split))["train"]
    full = load_from_disk(str(full_split))["train"]
    old_pairs = list(zip(old["source"], old["target"]))
    old_sources = {src for src, _ in old_pairs}
    new_pairs = [(s, t) for s, t in zip(full["source"], full["target"]) if s not in old_sources]
    return {name: random.Random(f"{seed}/{name}").sample(pairs, min(sample, len(pairs)))
            for name, pairs in (("old", old_pairs), ("new", new_pairs))}


def score_model(model_path: Path, pairs: list, cfg: EvaluateParams) -> dict:
    """The evaluate stage's scores of one model on `pairs`, with its own tokenizer."""
    model, _ = checkpoint.load_model(model_path)
    tok = load_tokenizers(model_path.parent / "tokenizer")
    sources = [s for s, _ in pairs]
    part = {"source": sources, "target": [t for _, t in pairs],
            "source_ids": tok.source.encode(sources)}
    result = translate_and_score(model, part, tok, cfg)[0]
    result.pop("risk_coverage")
    return result


@app.command(help=__doc__)
def main(
    old_split: Path = typer.Option(..., help="The parent run's data/split (train: old half)."),
    full_split: Path = typer.Option(..., help="data/split of the run on all training pairs."),
    model: list[str] = typer.Option(..., help="name=path/to/model.pt (tokenizer/ beside it)."),
    sample: int = typer.Option(2000, help="Pairs drawn from each half."),
    out: Path = typer.Option(Path("halves.json"), help="JSON to write."),
) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = load_params(EvaluateParams)
    pairs = halves(old_split, full_split, sample, seed=0)
    report: dict = {"sample": sample, "seed": 0, "beam_size": cfg.beam_size,
                    "pairs_per_half": {k: len(v) for k, v in pairs.items()}, "models": {}}
    for spec in model:
        name, _, path = spec.partition("=")
        report["models"][name] = {half: score_model(Path(path), rows, cfg)
                                  for half, rows in pairs.items()}
        print(name, {h: (r["bleu"], r["chrf"]) for h, r in report["models"][name].items()})
    write_json(out, report, indent=1)


if __name__ == "__main__":
    run_cli(app)
