"""download: fetch the parallel corpus -> data/raw/corpus.tsv, test.tsv (+ download.json).

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
data/raw/test.tsv, which is empty when the test split is to be carved out of the corpus.
`download.sha256`, when set, pins the corpus TSV. Outputs are written atomically, URLs are
recorded and shown with credentials and query strings redacted.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import tempfile
import zipfile
import zlib
from pathlib import Path

import typer

from src.core import paths, tracking
from src.core.atomic import atomic_path, write_json
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.core.params import DownloadParams, PairParams, load_params
from src.core.text import decode, split_lines
from src.data.transport import fetch, redact

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def pick_member(archive: zipfile.ZipFile, wanted: str) -> str:
    names = [n for n in archive.namelist() if not n.endswith("/")]
    if wanted:
        if wanted not in names:
            raise PipelineError(f"download.member '{wanted}' not in archive (has: {names})")
        return wanted
    texts = [n for n in names if n.lower().endswith((".txt", ".tsv")) and "about" not in n.lower()]
    if not texts:
        raise PipelineError(f"archive holds no .txt/.tsv corpus file (has: {names})")
    return max(texts, key=lambda n: archive.getinfo(n).file_size)


HTML_START = re.compile(rb"\s*<(!doctype\s+html|html)[\s>]", re.IGNORECASE)


def read_member(archive: zipfile.ZipFile, name: str, max_bytes: int) -> bytes:
    """One member's bytes, capped while inflating (a header's size can lie)."""
    info = archive.getinfo(name)
    if info.file_size > max_bytes:
        raise PipelineError(f"archive member {name} unzips to {info.file_size:,} bytes, more "
                            f"than download.max_bytes ({max_bytes:,}); raise it if expected")
    try:
        with archive.open(info) as fh:
            data = fh.read(max_bytes + 1)
    except RuntimeError as exc:  # zipfile's "File … is encrypted, password required"
        raise PipelineError(f"archive member {name} cannot be read: {exc}") from None
    except NotImplementedError as exc:
        raise PipelineError(f"archive member {name} uses an unsupported compression: "
                            f"{exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise PipelineError(f"archive member {name} is corrupt: {exc}") from None
    if len(data) > max_bytes:
        raise PipelineError(f"archive member {name} unzips to more than download.max_bytes "
                            f"({max_bytes:,} bytes); raise it if expected")
    return data


def as_utf8_text(data: bytes, source: str) -> str:
    """Strictly decoded text of a corpus file; an HTML page (a login or error page) refused."""
    if HTML_START.match(data[:1024]):
        raise PipelineError(f"{source} looks like an HTML page, not a corpus (a login or error "
                            "page?)")
    return decode(data, source)


def extract_corpus(payload: Path, member: str, max_bytes: int, shown: str) -> bytes:
    """The corpus TSV as UTF-8 bytes: the chosen member of a zip, or the payload itself."""
    if zipfile.is_zipfile(payload):
        try:
            with zipfile.ZipFile(payload) as archive:
                name = pick_member(archive, member)
                data, source = read_member(archive, name, max_bytes), f"{shown}:{name}"
        except zipfile.BadZipFile as exc:
            raise PipelineError(f"downloaded archive is corrupt: {exc}") from None
    else:
        data, source = payload.read_bytes(), shown
    text = as_utf8_text(data, source)
    if "\t" not in text[: 1 << 16]:
        raise PipelineError(f"{source} is not a TSV corpus (no tab-separated line)")
    # UTF-8 is kept byte for byte (its sha256 is the member's); UTF-16 is converted.
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    return text.encode("utf-8") if utf16 else data


def read_text_file(payload: Path, shown: str) -> list[str]:
    """Lines of one side of a parallel corpus (split at "\\n" only, see src.text)."""
    return split_lines(as_utf8_text(payload.read_bytes(), shown))


def join_sides(sides: dict[int, list[str]], urls: list[str]) -> bytes:
    """Aligned one-sentence-per-line files -> TSV bytes, each side in its column."""
    lengths = {len(lines) for lines in sides.values()}
    if len(lengths) != 1:
        counts = ", ".join(f"{u}: {len(lines):,}" for u, lines in zip(urls, sides.values()))
        raise PipelineError(f"parallel files differ in line count ({counts})")
    width = max(sides) + 1
    rows = []
    for i in range(lengths.pop()):
        cols = [""] * width
        for column, lines in sides.items():
            cols[column] = lines[i].replace("\t", " ")
        rows.append("\t".join(cols))
    return ("\n".join(rows) + "\n").encode("utf-8") if rows else b""


def side_urls(url: str, langs: dict[int, str]) -> list[str]:
    """One URL, or one per language for a `{lang}` URL (other braces, e.g. {year}, stay)."""
    if "{lang}" not in url:
        return [url]
    return [url.replace("{lang}", lang) for lang in langs.values()]


def fetch_corpus(url: str, cfg: DownloadParams, pair: PairParams, tmp_dir: Path) -> dict:
    """Fetch one corpus (a zip/TSV, or one file per language) -> TSV bytes and provenance."""
    langs = {pair.source_column: pair.source_lang, pair.target_column: pair.target_lang}
    urls = side_urls(url, langs)
    payloads = []
    for i, one_url in enumerate(urls):
        payloads.append(Path(tmp_dir) / f"payload{i}")
        fetch(one_url, payloads[-1], cfg.timeout_s, cfg.max_bytes)
    shown = [redact(u) for u in urls]
    if len(urls) == 1:
        corpus = extract_corpus(payloads[0], cfg.member, cfg.max_bytes, shown[0])
    else:
        sides = {col: read_text_file(p, u) for col, p, u in zip(langs, payloads, shown)}
        corpus = join_sides(sides, shown)
        if len(corpus) > cfg.max_bytes:
            raise PipelineError(f"the joined corpus is larger than download.max_bytes "
                                f"({cfg.max_bytes:,} bytes); raise it if expected")
    return {
        "corpus": corpus,
        "info": {
            "urls": shown,
            "payload_sha256": [hashlib.sha256(p.read_bytes()).hexdigest() for p in payloads],
            "corpus_bytes": len(corpus),
            "corpus_sha256": hashlib.sha256(corpus).hexdigest(),
            "corpus_lines": corpus.count(b"\n"),
        },
    }


@app.command()
def main(
    out: Path = typer.Option(paths.RAW_CORPUS, help="Corpus TSV to write."),
    test_out: Path = typer.Option(paths.RAW_TEST, help="Predefined test TSV (empty if none)."),
    meta: Path = typer.Option(paths.RAW_META, help="JSON with urls, sizes and sha256s."),
) -> None:
    """Download the corpus named by params `download.url` (http(s), file:// or a local path;
    zip, plain TSV, or one text file per language via `{lang}`) and the optional predefined
    test set `download.test_url`; write each as one UTF-8 TSV, atomically."""
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
        with atomic_path(test_out) as tmp:
            tmp.write_bytes(test["corpus"] if test else b"")
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
