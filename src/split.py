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

import pyarrow.compute as pc
import typer

from src.core import paths, tracking
from src.core.atomic import write_json
from src.core.cli import run_cli
from src.core.errors import PipelineError, require_file
from src.core.params import PairParams, SplitParams, load_params
from src.core.text import read_lines
from src.data.mixing import CorpusFile, mix
from src.data.splitting import pairs_table, read_pairs, write_parts

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
    manifest = read_manifest(meta)
    corpora = listed_corpora(raw_dir, manifest)
    test_tsv = raw_dir / paths.RAW_TEST.name
    named_files = {name: raw_dir / paths.RAW_TEST_SETS.name / f"{name}.tsv"
                   for name in (t["name"] for t in manifest.get("test_sets", []))}
    with tracking.stage_run(
        "split", {"pair": pair.model_dump(), "split": cfg.model_dump()},
        deps=[c.path for c in corpora]
    ) as run:
        test, test_dropped = None, Counter()
        if test_tsv.exists():
            test, test_dropped = read_test_set(test_tsv, pair, "the predefined test set")
        named = {name: read_test_set(path, pair, f"test set {name}")[0]
                 for name, path in named_files.items()}
        held_out = frozenset(src for rows in named.values() for src, _ in rows)
        mixed = mix(corpora, pair, cfg, test, held_out)
        per_corpus = mixed.counts
        parts = mixed.parts | {paths.NAMED_TEST_SPLIT.format(name): pairs_table(rows)
                               for name, rows in named.items()}
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
            **{f"n_{name}": table.num_rows for name, table in parts.items()},
            **{f"sources_{name}": pc.count_distinct(table["source"]).as_py()
               for name, table in parts.items()},
        }
        write_json(stats, counts | {"corpora": per_corpus})
        run.log_metrics(counts | {f"{name}.{key}": value for name, c in per_corpus.items()
                                  for key, value in c.items()})
    print("split: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    if len(corpora) > 1:
        for corpus in corpora:
            c = per_corpus[corpus.name]
            print(f"  {corpus.name}: read {c['read']:,}, kept {c['kept']:,}, duplicates "
                  f"{c['dropped_duplicate']:,}, in the test set {c['dropped_in_test_set']:,}, "
                  f"train {c['train']:,} x weight = {c['train_weighted']:,}"
                  f"{' (drawn afresh each epoch)' if corpus.per_epoch else ''}")


def read_manifest(meta: Path) -> dict:
    """download.json; without it (a corpus put in place by hand) data/raw/corpus.tsv alone."""
    if not meta.exists():
        return {"corpora": [{"name": paths.RAW_CORPUS.stem, "weight": 1.0}]}
    manifest = json.loads(meta.read_text(encoding="utf-8"))
    if not manifest.get("corpora"):
        raise PipelineError(f"{meta} lists no corpora (written by an older download stage?); "
                            "run `dvc repro download` again")
    return manifest


def listed_corpora(raw_dir: Path, manifest: dict) -> list[CorpusFile]:
    """The corpora `download` wrote, in their params order, with their weights."""
    corpora = [CorpusFile(c["name"], raw_dir / f"{c['name']}.tsv", c["weight"],
                          c.get("per_epoch", False), c.get("train_only", False))
               for c in manifest["corpora"]]
    for corpus in corpora:
        require_file(corpus.path, "download")
    return corpora


def read_test_set(path: Path, pair: PairParams, what: str) -> tuple[list, Counter]:
    """A published test set, kept whole: no length limit, duplicates stay. Rows that cannot be
    scored (empty side, missing column) are counted and warned about, since scores on a
    shortened test set are not comparable with published ones."""
    require_file(path, "download")
    read = read_pairs(read_lines(path), pair, max_chars=10**9)
    if not read.pairs:
        raise PipelineError(f"{path}: {what} has no valid pair")
    if read.dropped:
        lost = ", ".join(f"{n} {why}" for why, n in sorted(read.dropped.items()))
        print(f"warning: {what} lost {sum(read.dropped.values())} of "
              f"{len(read.pairs) + sum(read.dropped.values())} rows ({lost}); its scores are "
              "not comparable with published ones", file=sys.stderr)
    return read.pairs, read.dropped


if __name__ == "__main__":
    run_cli(app)
