"""Fetch one URL into a file, or fail with one line that says what went wrong.

One path for every download (corpus, test set, each `{lang}` file):
* http(s) through urllib3 2: the body must match Content-Length; a whole-transfer deadline
  (`download.timeout_s`) holds even against a server that trickles bytes (reads return as soon
  as some data is there, and the clock is checked between them); a stalled read fails after
  at most `STALL_S`; redirects are followed by hand (at most `MAX_REDIRECTS`), never from https
  down to http;
* `file://` URLs and plain paths (relative to the repo root) are copied;
* every payload is capped at `download.max_bytes`, up front by Content-Length and while
  streaming;
* a failure while *writing* (disk full, permissions) is reported as that, not as a network
  error; URLs are shown with credentials and query strings redacted.
"""

from __future__ import annotations

import http.client
import shutil
import time
import urllib.parse
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from src.core import paths
from src.core.errors import PipelineError

USER_AGENT = (  # manythings.org refuses bare clients
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0 Safari/537.36"
)
CHUNK = 1 << 16
STALL_S = 30.0
MAX_REDIRECTS = 5


def redact(url: str) -> str:
    """`https://user:pw@host/p?sig=…` -> `https://***@host/p?***`: safe to log and print."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or parts.scheme == "file":
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def local_path(url: str) -> Path | None:
    """The filesystem path a `file://` URL or plain path names, or None for http(s)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":  # a plain path, relative to the repo root
        return paths.ROOT / url
    if parsed.scheme in {"http", "https"}:
        return None
    raise PipelineError(f"unsupported URL scheme '{parsed.scheme}' in {redact(url)}")


class _Sink:
    """The destination file; its OSErrors are write errors, never network errors."""

    def __init__(self, dest: Path, limit: int, shown: str):
        self.dest, self.limit, self.shown, self.size = dest, limit, shown, 0
        try:
            self.fh = dest.open("wb")
        except OSError as exc:
            raise PipelineError(f"cannot write {dest}: {exc.strerror}") from None

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise PipelineError(f"{self.shown} is larger than download.max_bytes "
                                f"({self.limit:,} bytes); raise it if this is expected")
        try:
            self.fh.write(chunk)
        except OSError as exc:
            raise PipelineError(f"cannot write {self.dest}: {exc.strerror}") from None

    def close(self) -> None:
        try:
            self.fh.close()
        except OSError as exc:
            raise PipelineError(f"cannot write {self.dest}: {exc.strerror}") from None


def fetch(url: str, dest: Path, timeout_s: float, max_bytes: int) -> None:
    """Copy the resource at `url` into `dest` (see the module docstring for the guarantees)."""
    source = local_path(url)
    if source is not None:
        if not source.is_file():
            raise PipelineError(f"no such file {source}")
        if source.stat().st_size > max_bytes:
            raise PipelineError(f"{source} is larger than download.max_bytes "
                                f"({max_bytes:,} bytes); raise it if this is expected")
        try:
            shutil.copyfile(source, dest)
        except OSError as exc:
            raise PipelineError(f"cannot copy {source} to {dest}: {exc.strerror}") from None
        return
    import urllib3

    sink = _Sink(dest, max_bytes, redact(url))
    try:
        _fetch_http(url, sink, timeout_s)
    except PipelineError:
        raise
    except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.NameResolutionError,
            urllib3.exceptions.ConnectTimeoutError) as exc:
        raise PipelineError(f"download failed: cannot reach {redact(url)} ({_unreachable(exc)})"
                            ) from None
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError) as exc:
        raise PipelineError(f"download failed: {redact(url)}: {_reason(exc)}") from None
    finally:
        sink.close()


def _unreachable(exc: BaseException) -> str:
    """Why no connection was made, without the connection object urllib3 puts in its errors:
    `[Errno 111] Connection refused`, `Connection to host timed out. (connect timeout=30)`."""
    message = str(exc.args[-1]) if exc.args else ""
    return message.rpartition(": ")[2].strip() or type(exc).__name__


def _reason(exc: BaseException) -> str:
    """The innermost useful message of a urllib3 error chain, on one line."""
    reason = getattr(exc, "reason", None) or exc
    text = str(reason).strip() or type(reason).__name__
    if isinstance(reason, TimeoutError) or "timed out" in text.lower():
        return f"timed out ({text.split(':')[-1].strip()})"
    return f"{type(reason).__name__}: {text}"[:300]


def redirect_target(current: str, location: str) -> str:
    """Where a redirect leads (relative Locations resolved); never from https down to http."""
    target = urllib.parse.urljoin(current, location)
    if urllib.parse.urlsplit(target).scheme not in {"http", "https"}:
        raise PipelineError(f"download refused: {redact(current)} redirects to {redact(target)}")
    if current.startswith("https:") and not target.startswith("https:"):
        raise PipelineError(f"download refused: {redact(current)} redirects to insecure "
                            f"{redact(target)}")
    return target


def _fetch_http(url: str, sink: _Sink, timeout_s: float) -> None:
    import urllib3

    deadline = time.monotonic() + timeout_s
    pool = urllib3.PoolManager(headers=urllib3.make_headers(user_agent=USER_AGENT))
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PipelineError(f"download failed: {redact(url)} did not finish within "
                                f"download.timeout_s={timeout_s:g} s")
        timeout = urllib3.Timeout(connect=min(STALL_S, remaining), read=min(STALL_S, remaining))
        # not mutated: urllib3 upper-cases the method, None or omitted options are its own
        # defaults, and with retries=False it never follows a redirect itself
        resp = pool.request(  # pragma: no mutate
            "GET", current, preload_content=False, redirect=False,  # pragma: no mutate
            decode_content=True,  # pragma: no mutate
            retries=False, timeout=timeout)
        try:
            location = resp.headers.get("Location")  # pragma: no mutate (names: any case)
            if resp.status in (301, 302, 303, 307, 308) and location:
                current = redirect_target(current, location)
                # The next hop gets a fresh connection: a server may close this one right
                # after the redirect, and reusing it races the close (without retries, a lost
                # race failed the download under load; seen in tests with a busy CPU).
                resp.release_conn()
                pool.clear()
                continue
            if resp.status != 200:
                raise PipelineError(f"download failed: HTTP {resp.status} {resp.reason} for "
                                    f"{redact(current)}")
            _stream(resp, sink, deadline, timeout_s, redact(current))
            return
        finally:
            resp.release_conn()
    raise PipelineError(f"download failed: more than {MAX_REDIRECTS} redirects from {redact(url)}")


def _read_some(resp, sink: _Sink, expected: int | None, shown: str) -> bytes:
    """The bytes that have arrived (read1 never waits for a full chunk); a body cut short is
    reported as such (urllib3 raises on it before we can compare with Content-Length)."""
    import urllib3

    try:
        return resp.read1(CHUNK)
    except urllib3.exceptions.ProtocolError as exc:
        if expected is not None and "IncompleteRead" in str(exc):
            raise PipelineError(f"download failed: received {sink.size:,} of {expected:,} "
                                f"bytes from {shown} (connection closed early)") from None
        raise


def _stream(resp, sink: _Sink, deadline: float, timeout_s: float, shown: str) -> None:
    length = resp.headers.get("Content-Length")  # pragma: no mutate (names: any case)
    encoding = resp.headers.get("Content-Encoding", "identity")  # pragma: no mutate (same)
    encoded = encoding != "identity"
    expected = None
    if length is not None and not encoded:
        if not length.strip().isdigit():
            raise PipelineError(f"download failed: {shown} sent a bad Content-Length {length!r}")
        expected = int(length)
        if expected > sink.limit:
            raise PipelineError(f"{shown} is {expected:,} bytes, larger than download.max_bytes "
                                f"({sink.limit:,}); raise it if this is expected")
    columns = (*Progress.get_default_columns()[:1], BarColumn(), DownloadColumn(),
               TransferSpeedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(f"download {Path(urllib.parse.urlsplit(shown).path).name}",
                            total=expected)
        while chunk := _read_some(resp, sink, expected, shown):
            sink.write(chunk)
            bar.advance(task, len(chunk))
            if time.monotonic() > deadline:  # pragma: no mutate (>= on a float clock: same)
                raise PipelineError(f"download failed: {shown} did not finish within "
                                    f"download.timeout_s={timeout_s:g} s")
    if expected is not None and sink.size != expected:
        # urllib3 (enforce_content_length) raises first, caught in _read_some; this line only
        # guards against a urllib3 that stops doing so, hence unreachable by any test
        raise PipelineError(  # pragma: no mutate
            f"download failed: received {sink.size:,} of {expected:,} bytes from {shown}")
