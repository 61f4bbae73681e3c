"""split: data/raw/{corpus,test}.tsv -> data/split/{train,valid,test} (a `datasets` DatasetDict).

Reads params `pair.*` (which column is source/target) and `split.*`. Lines are cleaned,
empty/malformed/over-long lines dropped and counted, exact duplicates removed, then the
distinct *source sentences* are shuffled with `split.seed` and assigned to valid/test/train,
so a sentence with several translations never straddles two splits. When `download` wrote a
predefined test set (data/raw/test.tsv not empty), that is the test split, `split.test_size` is
unused, and corpus pairs whose source sentence is in it are dropped from train and valid.
Files are decoded strictly (src/text.py): text that is not UTF-8 stops the stage with the
file, line and byte offset instead of becoming training data. Counts go to
data/split_stats.json (and MLflow); rows a predefined test set loses are counted and warned about.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import typer

from src.core import paths, tracking
from src.core.atomic import atomic_dir, write_json
from src.core.cli import run_cli
from src.core.errors import PipelineError, require_file
from src.core.params import PairParams, SplitParams, load_params
from src.core.text import read_lines

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)

Pair = tuple[str, str]


@dataclass
class Cleaned:
    pairs: list[Pair] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)


def clean_text(text: str) -> str:
    return " ".join(text.replace("\ufeff", "").split())


def read_pairs(lines, pair: PairParams, max_chars: int, dedupe: bool = True) -> Cleaned:
    """Parse TSV lines (already split at "\n", see src.text) into (source, target) pairs;
    count why others were dropped."""
    out = Cleaned()
    seen: set[Pair] = set()
    need = max(pair.source_column, pair.target_column) + 1
    for line in lines:
        if not line.strip():
            out.dropped["empty"] += 1
            continue
        cols = line.split("\t")
        if len(cols) < need:
            out.dropped["malformed"] += 1
            continue
        src, tgt = clean_text(cols[pair.source_column]), clean_text(cols[pair.target_column])
        if not src or not tgt:
            out.dropped["empty"] += 1
        elif len(src) > max_chars or len(tgt) > max_chars:
            out.dropped["too_long"] += 1
        elif dedupe and (src, tgt) in seen:
            out.dropped["duplicate"] += 1
        else:
            seen.add((src, tgt))
            out.pairs.append((src, tgt))
    return out


def group_count(size: float, n_groups: int) -> int:
    """`split.valid_size`/`test_size`: a fraction of the groups if < 1, else a count."""
    return int(round(size * n_groups)) if size < 1 else int(size)


def split_grouped(
    pairs: list[Pair], cfg: SplitParams, test: list[Pair] | None = None
) -> dict[str, list[Pair]]:
    """Assign whole source-sentence groups to valid, test and train (in that order).

    With a predefined `test`, only valid and train are carved out, and corpus pairs whose
    source sentence is a test source are left out (counted by the caller).
    """
    if test:
        test_sources = {src for src, _ in test}
        pairs = [(s, t) for s, t in pairs if s not in test_sources]
    sources = sorted({src for src, _ in pairs})
    random.Random(cfg.seed).shuffle(sources)
    n_valid = group_count(cfg.valid_size, len(sources))
    n_test = 0 if test else group_count(cfg.test_size, len(sources))
    if n_valid + n_test >= len(sources):
        raise PipelineError(
            f"split: valid ({n_valid}) + test ({n_test}) source sentences leave none of "
            f"{len(sources)} for training; lower split.valid_size/test_size"
        )
    part_of = {s: "valid" for s in sources[:n_valid]}
    part_of.update({s: "test" for s in sources[n_valid : n_valid + n_test]})
    parts: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    for src, tgt in pairs:
        parts[part_of.get(src, "train")].append((src, tgt))
    if test:
        parts["test"] = list(test)
    return parts


def write_parts(parts: dict[str, list[Pair]], out_dir: Path) -> None:
    from datasets import Dataset, DatasetDict, disable_progress_bars

    disable_progress_bars()
    dataset = DatasetDict(
        {
            name: Dataset.from_dict(
                {"source": [s for s, _ in rows], "target": [t for _, t in rows]}
            )
            for name, rows in parts.items()
        }
    )
    with atomic_dir(out_dir) as tmp:
        dataset.save_to_disk(str(tmp))


@app.command()
def main(
    corpus: Path = typer.Option(paths.RAW_CORPUS, help="Corpus TSV from `download`."),
    test_tsv: Path = typer.Option(paths.RAW_TEST, help="Predefined test TSV (may be empty)."),
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
        if test_tsv.exists() and test_tsv.stat().st_size:
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
