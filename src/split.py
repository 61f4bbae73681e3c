"""split: data/raw/{corpus,test}.tsv -> data/split/{train,valid,test} (a `datasets` DatasetDict).

Reads params `pair.*` (which column is source/target) and `split.*`. Lines are cleaned,
empty/malformed/over-long lines dropped and counted, exact duplicates removed, then the
distinct *source sentences* are shuffled with `split.seed` and assigned to valid/test/train,
so a sentence with several translations never straddles two splits. When `download` wrote a
predefined test set (data/raw/test.tsv), that is the test split, `split.test_size` is
unused, and corpus pairs whose source sentence is in it are dropped from train and valid.
Files are decoded strictly (src/text.py): text that is not UTF-8 stops the stage with the
file, line and byte offset instead of becoming training data. Counts go to
data/split_stats.json (and MLflow); rows a predefined test set loses are counted and warned about.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import typer

from src.core import paths, tracking
from src.core.atomic import write_json
from src.core.cli import run_cli
from src.core.errors import PipelineError, require_file
from src.core.params import PairParams, SplitParams, load_params
from src.core.text import read_lines
from src.data.splitting import (
    read_pairs,
    split_grouped,
    write_parts,
)

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    corpus: Path = typer.Option(paths.RAW_CORPUS, help="Corpus TSV from `download`."),
    test_tsv: Path = typer.Option(paths.RAW_TEST, help="Predefined test TSV (absent: none)."),
    out_dir: Path = typer.Option(paths.SPLIT, help="DatasetDict directory to write."),
    stats: Path = typer.Option(paths.SPLIT_STATS, help="Counts JSON to write."),
) -> None:
    """Clean the corpus and split it train/valid/test, grouped by source sentence
    (params `pair.*`, `split.*`)."""
    pair = load_params(PairParams)
    cfg = load_params(SplitParams)
    require_file(corpus, "download")
    with tracking.stage_run(
        "split", {"pair": pair.model_dump(), "split": cfg.model_dump()}, deps=[corpus]
    ) as run:
        cleaned = read_pairs(read_lines(corpus), pair, cfg.max_chars)
        if not cleaned.pairs:
            raise PipelineError(
                f"{corpus}: no valid '{pair.source_lang}<TAB>{pair.target_lang}' line found"
            )
        test, test_dropped = None, Counter()
        if test_tsv.exists():
            # A published test set is kept whole: no length limit, duplicates stay. Rows that
            # cannot be scored (empty side, missing column) are counted and reported, since
            # scores on a shortened test set are not comparable with published ones.
            read = read_pairs(read_lines(test_tsv), pair, max_chars=10**9, dedupe=False)
            test, test_dropped = read.pairs, read.dropped
            if not test:
                raise PipelineError(f"{test_tsv}: the predefined test set has no valid pair")
            if test_dropped:
                what = ", ".join(f"{n} {why}" for why, n in sorted(test_dropped.items()))
                print(f"warning: the predefined test set lost {sum(test_dropped.values())} of "
                      f"{len(test) + sum(test_dropped.values())} rows ({what}); its scores are "
                      "not comparable with published ones", file=sys.stderr)
        parts = split_grouped(cleaned.pairs, cfg, test)
        write_parts(parts, out_dir)
        # corpus pairs left out because their source sentence is in the predefined test set
        in_test_set = len(cleaned.pairs) - len(parts["train"]) - len(parts["valid"]) if test else 0
        counts = {
            "kept": len(cleaned.pairs),
            "dropped_in_test_set": in_test_set,
            "predefined_test": int(bool(test)),
            **{f"test_dropped_{k}": test_dropped.get(k, 0) for k in ("empty", "malformed")},
            **{
                f"dropped_{k}": cleaned.dropped.get(k, 0)
                for k in ("empty", "malformed", "too_long", "duplicate")
            },
            **{f"n_{name}": len(rows) for name, rows in parts.items()},
            **{f"sources_{name}": len({s for s, _ in rows}) for name, rows in parts.items()},
        }
        write_json(stats, counts)
        run.log_metrics(counts)
    print("split: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))


if __name__ == "__main__":
    run_cli(app)
