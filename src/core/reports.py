"""What a stage reports: a few headline metrics for DVC, everything for the stats file.

`dvc exp show` and `dvc metrics diff` put every key of every `metrics:` file in a column, so a
metrics file holds only what users compare across experiments (scores, training minutes,
speed, size). Counts, vocabulary sizes, unk rates, parity and providers go to a stats file (a
plain DVC output kept in git) and to MLflow, where they are one click away.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from src.core.atomic import atomic_path, write_json

# Source-length buckets (words) of evaluate's scores: the corpus averages six words, and the
# long tail is where users feel the quality.
LENGTH_BUCKETS = (("le6w", 1, 6), ("7to9w", 7, 9), ("ge10w", 10, None))

TRAIN_HEADLINE = ("valid_bleu", "train_minutes", "tokens_per_s")
EVALUATE_HEADLINE = ("bleu", "chrf") + tuple(
    f"{metric}_{name}" for name, _, _ in LENGTH_BUCKETS for metric in ("bleu", "chrf")) + (
    "confidence_auroc", "review_catch_10")
EXPORT_HEADLINE = ("fp32_bleu", "fp32_size_mb", "fp32_sentences_per_s",
                   "int8_bleu", "int8_size_mb", "int8_sentences_per_s")


def headline(result: dict, keys: Iterable[str]) -> dict:
    """The headline keys present in `result`, in the order given."""
    return {key: result[key] for key in keys if key in result}


def write_report(result: dict, stats: Path, metrics: Path | None = None,
                 keys: Iterable[str] = ()) -> None:
    """Everything to `stats`; the headline keys also to `metrics` (if the stage has one)."""
    write_json(stats, result)
    if metrics is not None:
        write_json(metrics, headline(result, keys))


def write_curve(path: Path, rows: list[dict]) -> None:
    """Rows of one curve as CSV (a DVC plot), its columns the first row's keys."""
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
