"""download: fetch the parallel corpus -> data/raw/corpus.tsv (+ download.json with size/sha256).

Reads params `download.url`, `download.member`, `download.timeout_s`. The URL may be http(s)
(sent with a browser-like User-Agent: manythings.org refuses bare clients), `file://`, or a
local path; the payload may be a zip archive (the member is extracted) or a plain TSV.
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
from src.params import DownloadParams, load_params

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


@app.command()
def main(
    out: Path = typer.Option(paths.RAW_CORPUS, help="Corpus TSV to write."),
    meta: Path = typer.Option(paths.RAW_META, help="JSON with url, size and sha256."),
) -> None:
    """Download the corpus named by params `download.url` (http(s), file:// or a local path;
    zip or plain TSV) and write it as one UTF-8 TSV, atomically."""
    cfg: DownloadParams = load_params("download")
    with tracking.stage_run("download", {"download": cfg.model_dump()}) as run:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".download.") as tmp_dir:
            payload = Path(tmp_dir) / "payload"
            fetch(cfg.url, payload, cfg.timeout_s)
            raw_sha = hashlib.sha256(payload.read_bytes()).hexdigest()
            corpus = extract_corpus(payload, cfg.member)
            payload_size = payload.stat().st_size
        with atomic_path(out) as tmp:
            tmp.write_bytes(corpus)
        info = {
            "url": cfg.url,
            "payload_bytes": payload_size,
            "payload_sha256": raw_sha,
            "corpus_bytes": len(corpus),
            "corpus_sha256": hashlib.sha256(corpus).hexdigest(),
            "corpus_lines": corpus.count(b"\n"),
        }
        write_json(meta, info)
        run.log_metrics({"corpus_bytes": len(corpus), "corpus_lines": info["corpus_lines"]})
        run.set_tags({"corpus_sha256": info["corpus_sha256"]})
    print(f"wrote {out} ({len(corpus):,} bytes, sha256 {info['corpus_sha256'][:12]}…)")


if __name__ == "__main__":
    run_cli(app)
