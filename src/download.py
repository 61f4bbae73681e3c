"""download: fetch the parallel corpus -> data/raw/corpus.tsv, test.tsv (+ download.json).

Reads params `pair.*` and `download.*`. A URL may be http(s) (sent with a browser-like
User-Agent: manythings.org refuses bare clients), `file://`, or a local path; the payload may be
a zip archive (the member is extracted) or a plain TSV. A URL holding `{lang}` names one plain
text file per language, aligned line by line (train.en + train.vi style); they are joined into
the same TSV layout, each side in its `pair.*_column`.

`download.test_url` optionally names a predefined test set in the same forms; it is written to
data/raw/test.tsv, which is empty when the test split is to be carved out of the corpus.
Outputs are written atomically: a failure never leaves a half file behind.
"""

from __future__ import annotations

import codecs
import hashlib
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from src import paths, tracking
from src.atomic import atomic_path, write_json
from src.errors import PipelineError, run_cli
from src.params import DownloadParams, PairParams, load_params

USER_AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0 Safari/537.36"
)
CHUNK = 1 << 16

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def local_path(url: str) -> Path | None:
    """The filesystem path a `file://` URL or plain path names, or None for a remote URL."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":  # a plain path, relative to the repo root
        return paths.ROOT / url
    if parsed.scheme in {"http", "https"}:
        return None
    raise PipelineError(f"unsupported URL scheme '{parsed.scheme}' in download.url={url}")


def fetch(url: str, dest: Path, timeout_s: float) -> None:
    """Copy the resource at `url` into `dest` with a progress bar."""
    source = local_path(url)
    if source is not None:
        if not source.is_file():
            raise PipelineError(f"download.url: no such file {source}")
        shutil.copyfile(source, dest)
        return
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp, dest.open("wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) or None
            columns = (
                *Progress.get_default_columns()[:1],
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
            )
            with Progress(*columns, transient=True) as bar:
                task = bar.add_task(f"download {Path(url).name}", total=total)
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    bar.advance(task, len(chunk))
    except urllib.error.HTTPError as exc:
        raise PipelineError(f"download failed: HTTP {exc.code} {exc.reason} for {url}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PipelineError(f"download failed: cannot reach {url} ({reason})") from None


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


def extract_corpus(payload: Path, member: str) -> bytes:
    """The corpus TSV bytes: the chosen member of a zip, or the payload itself if it is text."""
    if zipfile.is_zipfile(payload):
        try:
            with zipfile.ZipFile(payload) as archive:
                return archive.read(pick_member(archive, member))
        except zipfile.BadZipFile as exc:
            raise PipelineError(f"downloaded archive is corrupt: {exc}") from None
    data = payload.read_bytes()
    try:  # an incremental decoder tolerates a multi-byte character cut at the 64 KiB boundary
        head = codecs.getincrementaldecoder("utf-8")().decode(data[: 1 << 16], final=False)
    except UnicodeDecodeError:
        raise PipelineError("downloaded file is neither a zip archive nor UTF-8 text") from None
    if "\t" not in head:
        raise PipelineError("downloaded file is not a TSV corpus (no tab-separated line)")
    return data


def read_text_file(payload: Path, url: str) -> list[str]:
    """Lines of one side of a parallel corpus (UTF-8, a leading BOM dropped)."""
    try:
        text = payload.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise PipelineError(f"{url} is not UTF-8 text") from None
    return text.splitlines()


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


def fetch_corpus(url: str, cfg: DownloadParams, pair: PairParams, tmp_dir: Path) -> dict:
    """Fetch one corpus (a zip/TSV, or one file per language) -> TSV bytes and provenance."""
    langs = {pair.source_column: pair.source_lang, pair.target_column: pair.target_lang}
    urls = [url.format(lang=lang) for lang in langs.values()] if "{lang}" in url else [url]
    payloads = []
    for i, one_url in enumerate(urls):
        payloads.append(Path(tmp_dir) / f"payload{i}")
        fetch(one_url, payloads[-1], cfg.timeout_s)
    if len(urls) == 1:
        corpus = extract_corpus(payloads[0], cfg.member)
    else:
        sides = {col: read_text_file(p, u) for col, p, u in zip(langs, payloads, urls)}
        corpus = join_sides(sides, urls)
    return {
        "corpus": corpus,
        "info": {
            "urls": urls,
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
    params = {"pair": pair.model_dump(), "download": cfg.model_dump()}
    with tracking.stage_run("download", params) as run:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".download.") as tmp_dir:
            corpus = fetch_corpus(cfg.url, cfg, pair, Path(tmp_dir))
            test = fetch_corpus(cfg.test_url, cfg, pair, Path(tmp_dir)) if cfg.test_url else None
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
