"""split: data/raw/<corpus>.tsv, test.tsv -> data/split/{train,valid,test} (a DatasetDict).

Reads params `pair.*` (which column is source/target) and `split.*`, and data/download.json for
the corpora and their weights. Lines are cleaned, empty/malformed/over-long lines dropped and
counted, exact duplicates removed (across corpora too: the first listed keeps a pair), then the
distinct *source sentences* of all corpora are shuffled with `split.seed` and assigned to
valid/test/train, so a sentence with several translations never straddles two splits; the
training part is then weighted per corpus (src/data/mixing.py). When `download` wrote a
predefined test set (data/raw/test.tsv), that is the test split, `split.test_size` is
unused, and corpus pairs whose source sentence is in it are dropped from train and valid.
Files are decoded strictly (src/core/text.py): text that is not UTF-8 stops the stage with the
file, line and byte offset instead of becoming training data. Counts, in total and per corpus,
go to data/split_stats.json (and MLflow); rows a predefined test set loses are counted and
warned about.
"""

from __future__ import annotations

import json
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
from src.data.mixing import CorpusFile, mix
from src.data.splitting import read_pairs, write_parts

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    raw_dir: Path = typer.Option(paths.RAW, help="Folder `download` wrote the corpora to."),
    meta: Path = typer.Option(paths.RAW_META, help="`download`'s JSON: the corpora, weights."),
    out_dir: Path = typer.Option(paths.SPLIT, help="DatasetDict directory to write."),
    stats: Path = typer.Option(paths.SPLIT_STATS, help="Counts JSON to write."),
) -> None:
    """Clean the corpora, mix them by weight and split them train/valid/test, grouped by source
    sentence (params `pair.*`, `split.*`)."""
    pair = load_params(PairParams)
    cfg = load_params(SplitParams)
    corpora = listed_corpora(raw_dir, meta)
    test_tsv = raw_dir / paths.RAW_TEST.name
    with tracking.stage_run(
        "split", {"pair": pair.model_dump(), "split": cfg.model_dump()},
        deps=[c.path for c in corpora]
    ) as run:
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
        mixed = mix(corpora, pair, cfg, test)
        per_corpus = mixed.counts
        parts = mixed.parts
        write_parts(parts, out_dir)
        total = {key: sum(c[key] for c in per_corpus.values())
                 for key in ("kept", "dropped_in_test_set")}
        counts = {
            "kept": total["kept"] + total["dropped_in_test_set"],
            "dropped_in_test_set": total["dropped_in_test_set"],
            "predefined_test": int(bool(test)),
            **{f"test_dropped_{k}": test_dropped.get(k, 0) for k in ("empty", "malformed")},
            **{
                f"dropped_{k}": sum(c[f"dropped_{k}"] for c in per_corpus.values())
                for k in ("empty", "malformed", "too_long", "duplicate")
            },
            **{f"n_{name}": len(rows) for name, rows in parts.items()},
            **{f"sources_{name}": len({s for s, _ in rows}) for name, rows in parts.items()},
        }
        write_json(stats, counts | {"corpora": per_corpus})
        run.log_metrics(counts | {f"{name}.{key}": value for name, c in per_corpus.items()
                                  for key, value in c.items()})
    print("split: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    if len(corpora) > 1:
        for name, c in per_corpus.items():
            print(f"  {name}: read {c['read']:,}, kept {c['kept']:,}, duplicates "
                  f"{c['dropped_duplicate']:,}, in the test set {c['dropped_in_test_set']:,}, "
                  f"train {c['train']:,} x weight = {c['train_weighted']:,}")


def listed_corpora(raw_dir: Path, meta: Path) -> list[CorpusFile]:
    """The corpora `download` wrote, in their params order, with their weights; without its
    JSON (a corpus put in place by hand), data/raw/corpus.tsv alone at weight 1."""
    if meta.exists():
        listed = json.loads(meta.read_text(encoding="utf-8")).get("corpora")
        if not listed:
            raise PipelineError(f"{meta} lists no corpora (written by an older download "
                                "stage?); run `dvc repro download` again")
    else:
        listed = [{"name": paths.RAW_CORPUS.stem, "weight": 1.0}]
    corpora = [CorpusFile(c["name"], raw_dir / f"{c['name']}.tsv", c["weight"]) for c in listed]
    for corpus in corpora:
        require_file(corpus.path, "download")
    return corpora


if __name__ == "__main__":
    run_cli(app)
