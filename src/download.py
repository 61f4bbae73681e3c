"""download: fetch the training corpora -> data/raw/<name>.tsv, test.tsv (+ data/download.json).

Reads params `pair.*` and `download.*`. `download.url` names one corpus (written as
data/raw/corpus.tsv); `download.corpora` lists several, each with a name, one source and a
weight (applied by `split`). A URL may be http(s), `file://`, or a local path (see
src/data/transport.py for what every fetch guarantees: length, deadline, size cap, redirects);
the payload may be a zip archive (the member is extracted, capped at `download.max_bytes` however
its header reads) or a plain TSV. A URL holding `{lang}` names one plain text file per
language, aligned line by line (train.en + train.vi style); they are joined into the same TSV
layout, each side in its `pair.*_column`. A `hub:` source is a dataset repo on the Hugging Face
Hub at a revision (src/data/hub.py); the commit that revision resolved to is written to
data/download.json, which DVC tracks, and to the stage's MLflow run.

Text is decoded strictly (src/core/text.py): UTF-8 or UTF-16 with a BOM; anything else, or an
HTML page, is refused with file, line and byte offset. Valid UTF-8 is written byte for byte (so
the corpus sha256 is the member's), UTF-16 is converted to UTF-8.
`download.test_url` optionally names a predefined test set in the same forms; it is written to
data/raw/test.tsv, which is absent when the test split is to be carved out of the corpus (DVC
declares the folder data/raw, so no empty output is declared and warned about).
A sha256, when set, pins a URL corpus's TSV. data/raw is replaced as a whole, only once every
corpus is in; URLs are recorded and shown with credentials and query strings redacted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from src.core import paths, tracking
from src.core.atomic import atomic_dir, write_json
from src.core.cli import run_cli
from src.core.params import CorpusSpec, DownloadParams, PairParams, TestSetSpec, load_params
from src.data.corpus import fetch_corpus, write_source
from src.data.sacrebleu_sets import check_set
from src.data.transport import redact

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    out_dir: Path = typer.Option(paths.RAW, help="Folder to write: <name>.tsv per corpus, "
                                 "test.tsv when download.test_url names one."),
    meta: Path = typer.Option(paths.RAW_META, help="JSON with sources, sizes and sha256s."),
) -> None:
    """Download the corpora named by params `download.url` or `download.corpora` (http(s),
    file:// or a local path: zip, plain TSV, or one text file per language via `{lang}`; or a
    Hugging Face Hub dataset at a revision) and the optional predefined test set
    `download.test_url`; write each as one UTF-8 TSV (columns as params `pair.*` say)."""
    pair = load_params(PairParams)
    cfg = load_params(DownloadParams)
    shown = cfg.model_dump() | {"url": redact(cfg.url), "test_url": redact(cfg.test_url),
                                "corpora": [shown_spec(c) for c in cfg.corpora],
                                "test_sets": [shown_spec(t) for t in cfg.test_sets]}
    params = {"pair": pair.model_dump(), "download": shown}
    for spec in cfg.test_sets:  # names checked before any download, so a typo fails at once
        if spec.sacrebleu:
            check_set(spec.sacrebleu, pair)
    with tracking.stage_run("download", params) as run:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".download.") as tmp_dir, \
                atomic_dir(out_dir) as new_dir:
            corpus_files = {spec.name: new_dir / f"{spec.name}.tsv" for spec in cfg.corpus_list()}
            corpora = [write_source(spec, cfg, pair, Path(tmp_dir), corpus_files[spec.name])
                       for spec in cfg.corpus_list()]
            test = fetch_corpus(cfg.test_url, cfg, pair, Path(tmp_dir)) if cfg.test_url else None
            if test:
                (new_dir / paths.RAW_TEST.name).write_bytes(test["corpus"])
            if cfg.test_sets:
                (new_dir / paths.RAW_TEST_SETS.name).mkdir()
            test_sets = [write_source(spec, cfg, pair, Path(tmp_dir),
                                      new_dir / paths.RAW_TEST_SETS.name / f"{spec.name}.tsv",
                                      corpus_files)
                         for spec in cfg.test_sets]
        info = {"corpora": corpora, "test": test["info"] if test else None,
                "test_sets": test_sets}
        write_json(meta, info)
        run.log_metrics({f"{c['name']}_{key}": c[key] for c in corpora
                         for key in ("corpus_bytes", "corpus_lines")}
                        | {"test_lines": test["info"]["corpus_lines"] if test else 0})
        run.set_tags({f"{c['name']}_sha256": c["corpus_sha256"] for c in corpora}
                     | {f"{c['name']}_hub_commit": c["hub"]["commit"] for c in corpora
                        if "hub" in c}
                     | {f"{c['name']}_license": c["license"] for c in [*corpora, *test_sets]
                        if "license" in c})
        run.log_sources(corpora)
        run.log_sources(test_sets, context="evaluation")
    for corpus in corpora:
        print(f"wrote {out_dir / corpus['name']}.tsv ({corpus['corpus_lines']:,} lines, "
              f"{corpus['corpus_bytes']:,} bytes, sha256 {corpus['corpus_sha256'][:12]}…)"
              + (f" from {corpus['hub']['id']} at commit {corpus['hub']['commit'][:12]}"
                 if "hub" in corpus else "")
              + (f": {dictionary_summary(corpus['dictionary'])}; licence {corpus['license']}"
                 if "dictionary" in corpus else ""))
    if test:
        print(f"wrote {out_dir / paths.RAW_TEST.name} ({test['info']['corpus_lines']:,} lines)")
    for named in test_sets:
        print(f"wrote test set {named['name']} ({named['corpus_lines']:,} lines)")
    specs, written = [*cfg.corpus_list(), *cfg.test_sets], [*corpora, *test_sets]
    if any(spec.hub and spec.hub.revision != one["hub"]["commit"]
           for spec, one in zip(specs, written)):
        print("note: a Hub branch or tag was read at the commit above; dvc repro does not see "
              "the branch move until its revision param changes (pin the commit to be sure)")


def dictionary_summary(counts: dict[str, int]) -> str:
    """One line: entries read, pairs kept and what each filter dropped (src/data/cedict.py)."""
    dropped = ", ".join(f"{n:,} {why.removeprefix('dropped_').replace('_', ' ')}"
                        for why, n in counts.items() if why.startswith("dropped_") and n)
    return (f"{counts['pairs']:,} pairs from {counts['entries']:,} entries; glosses dropped: "
            f"{dropped or 'none'}; {counts['explanations_cut']:,} kept without their "
            f"parenthesised explanation; {counts['no_chinese_headword']:,} entries without a "
            "Chinese headword")


def shown_spec(spec: CorpusSpec | TestSetSpec) -> dict:
    """A corpus entry as logged: its URL redacted, unset keys left out."""
    shown = spec.model_dump(exclude_defaults=True)
    if spec.url:
        shown["url"] = redact(spec.url)
    return shown


if __name__ == "__main__":
    run_cli(app)
