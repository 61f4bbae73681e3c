"""download: fetch the parallel corpus -> data/raw/corpus.tsv, test.tsv (+ data/download.json).

Reads params `pair.*` and `download.*`. A URL may be http(s), `file://`, or a local path (see
src/transport.py for what every fetch guarantees: length, deadline, size cap, redirects); the
payload may be a zip archive (the member is extracted, capped at `download.max_bytes` however
its header reads) or a plain TSV. A URL holding `{lang}` names one plain text file per
language, aligned line by line (train.en + train.vi style); they are joined into the same TSV
layout, each side in its `pair.*_column`.

Text is decoded strictly (src/text.py): UTF-8 or UTF-16 with a BOM; anything else, or an
HTML page, is refused with file, line and byte offset. Valid UTF-8 is written byte for byte (so
the corpus sha256 is the member's), UTF-16 is converted to UTF-8.
`download.test_url` optionally names a predefined test set in the same forms; it is written to
data/raw/test.tsv, which is absent when the test split is to be carved out of the corpus (DVC
declares the folder data/raw, so no empty output is declared and warned about).
`download.sha256`, when set, pins the corpus TSV. Outputs are written atomically, URLs are
recorded and shown with credentials and query strings redacted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from src.core import paths, tracking
from src.core.atomic import atomic_path, write_json
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.core.params import DownloadParams, PairParams, load_params
from src.data.corpus import (
    fetch_corpus,
)
from src.data.transport import redact

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    out: Path = typer.Option(paths.RAW_CORPUS, help="Corpus TSV to write."),
    test_out: Path = typer.Option(paths.RAW_TEST, help="Predefined test TSV (absent if none)."),
    meta: Path = typer.Option(paths.RAW_META, help="JSON with urls, sizes and sha256s."),
) -> None:
    """Download the corpus named by params `download.url` (http(s), file:// or a local path;
    zip, plain TSV, or one text file per language via `{lang}`) and the optional predefined
    test set `download.test_url`; write each as one UTF-8 TSV, atomically (columns as params
    `pair.*` say)."""
    pair = load_params(PairParams)
    cfg = load_params(DownloadParams)
    shown = cfg.model_dump() | {"url": redact(cfg.url), "test_url": redact(cfg.test_url)}
    params = {"pair": pair.model_dump(), "download": shown}
    with tracking.stage_run("download", params) as run:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".download.") as tmp_dir:
            corpus = fetch_corpus(cfg.url, cfg, pair, Path(tmp_dir))
            test = fetch_corpus(cfg.test_url, cfg, pair, Path(tmp_dir)) if cfg.test_url else None
        got = corpus["info"]["corpus_sha256"]
        if cfg.sha256 and got != cfg.sha256:
            raise PipelineError(f"download.sha256 mismatch: expected {cfg.sha256}, got {got} "
                                f"for {redact(cfg.url)} (the corpus changed upstream?)")
        with atomic_path(out) as tmp:
            tmp.write_bytes(corpus["corpus"])
        if test:
            with atomic_path(test_out) as tmp:
                tmp.write_bytes(test["corpus"])
        else:  # a predefined test set of an earlier run must not stay the test split
            test_out.unlink(missing_ok=True)
        info = {"corpus": corpus["info"], "test": test["info"] if test else None}
        write_json(meta, info)
        lines = {"corpus_lines": corpus["info"]["corpus_lines"],
                 "test_lines": test["info"]["corpus_lines"] if test else 0}
        run.log_metrics({"corpus_bytes": corpus["info"]["corpus_bytes"], **lines})
        run.set_tags({"corpus_sha256": corpus["info"]["corpus_sha256"]})
    sha = corpus["info"]["corpus_sha256"]
    print(f"wrote {out} ({corpus['info']['corpus_bytes']:,} bytes, sha256 {sha[:12]}…)"
          + (f" and {test_out} ({lines['test_lines']:,} lines)" if test else ""))


if __name__ == "__main__":
    run_cli(app)
