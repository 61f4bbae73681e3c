"""transport.fetch in process, against a loopback server that replies byte by byte: what arrives
is stored whole, every way a server or the disk can fail is one line naming it (URL redacted),
and the limits (size, redirects, stalls, the total deadline) hold."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from loopback import CORPUS, raw_server, replies

from src.core.errors import PipelineError
from src.data import transport
from src.data.transport import USER_AGENT, fetch


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def failure(url: str, dest: Path, timeout_s: float = 30, max_bytes: int = 10**7) -> str:
    with pytest.raises(PipelineError) as info:
        fetch(url, dest, timeout_s, max_bytes)
    return str(info.value)


def fetch_to(tmp_path, url: str, timeout_s: float = 30) -> bytes:
    dest = tmp_path / "payload"
    fetch(url, dest, timeout_s, 10**7)
    return dest.read_bytes()


@pytest.mark.parametrize("status", [b"404 Not Found", b"500 Internal Server Error",
                                    b"204 No Content"])
def test_a_status_other_than_200_fails_and_names_it(tmp_path, status):
    response = b"HTTP/1.1 " + status + b"\r\nContent-Length: 3\r\n\r\nabc"
    with raw_server(replies(response)) as base:
        with pytest.raises(PipelineError, match=f"download failed: HTTP {status.decode()} for "
                                                f"{base}/cmn.txt"):
            fetch_to(tmp_path, f"{base}/cmn.txt")


def test_a_redirect_loop_stops_at_the_limit(tmp_path):
    hops, limit = [], transport.MAX_REDIRECTS

    def respond(conn, path):
        hops.append(path)
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /again%d\r\nContent-Length: 0\r\n\r\n"
                     % len(hops))

    with raw_server(respond) as base:
        with pytest.raises(PipelineError,
                           match=f"more than {limit} redirects from {base}/start"):
            fetch_to(tmp_path, f"{base}/start")
    assert len(hops) == limit + 1


def test_a_redirect_to_another_scheme_is_refused(tmp_path):
    def respond(conn, path):
        conn.sendall(b"HTTP/1.1 301 Moved\r\nLocation: ftp://files.example/cmn.txt\r\n"
                     b"Content-Length: 0\r\n\r\n")

    with raw_server(respond) as base:
        with pytest.raises(PipelineError, match="redirects to ftp://files.example/cmn.txt"):
            fetch_to(tmp_path, f"{base}/cmn.txt")


@pytest.mark.parametrize("url", ["ftp://files.example/cmn.zip", "s3://bucket/cmn.zip"])
def test_an_unsupported_scheme_is_named(tmp_path, url):
    scheme = url.split(":")[0]
    with pytest.raises(PipelineError, match=f"unsupported URL scheme '{scheme}'"):
        fetch_to(tmp_path, url)


def test_a_server_that_stops_sending_fails_after_the_stall_limit(tmp_path, monkeypatch):
    """A read that waits longer than STALL_S (30 s; 0.5 s here) fails well before the total
    deadline (download.timeout_s, 60 s here)."""
    monkeypatch.setattr(transport, "STALL_S", 0.5)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n"
    with raw_server(replies(head, b"x" * 10, b"", delay_s=3)) as base:
        start = time.monotonic()
        with pytest.raises(PipelineError, match="timed out"):
            fetch_to(tmp_path, f"{base}/cmn.txt", timeout_s=60)
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_stored_decoded(tmp_path, encoding):
    import gzip
    import zlib

    body = gzip.compress(CORPUS) if encoding == "gzip" else zlib.compress(CORPUS)
    response = (b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n"
                % (encoding.encode(), len(body))) + body
    with raw_server(replies(response)) as base:
        assert fetch_to(tmp_path, f"{base}/cmn.txt") == CORPUS


def test_credentials_and_queries_are_redacted_and_nothing_else():
    assert transport.redact("https://user:pw@host.example:8443/a/b.zip?X-Sig=1&e=2#frag") == \
        "https://***@host.example:8443/a/b.zip?***"
    assert transport.redact("https://a:b@c@host/x") == "https://***@host/x"  # last @ ends them
    assert transport.redact("http://host/plain.zip") == "http://host/plain.zip"
    assert transport.redact("file:///data/c.zip?x=1") == "file:///data/c.zip?x=1"
    assert transport.redact("data/cmn.zip") == "data/cmn.zip"


def test_local_sources_are_copied_checked_and_named(tmp_path, monkeypatch):
    from src.core import paths

    monkeypatch.setattr(paths, "ROOT", tmp_path)
    (tmp_path / "c d.tsv").write_bytes(CORPUS)
    assert transport.local_path("c d.tsv") == tmp_path / "c d.tsv"  # relative to the root
    assert transport.local_path(f"file://{tmp_path}/c%20d.tsv") == tmp_path / "c d.tsv"
    assert transport.local_path("https://host/x") is None
    dest = tmp_path / "out"
    fetch("c d.tsv", dest, 30, len(CORPUS))  # exactly the limit is fine
    assert dest.read_bytes() == CORPUS
    with pytest.raises(PipelineError) as info:
        fetch("c d.tsv", dest, 30, len(CORPUS) - 1)
    assert str(info.value) == (f"{tmp_path / 'c d.tsv'} is larger than download.max_bytes "
                               f"({len(CORPUS) - 1:,} bytes); raise it if this is expected")
    with pytest.raises(PipelineError) as info:
        fetch("missing.tsv", dest, 30, 10**6)
    assert str(info.value) == f"no such file {tmp_path / 'missing.tsv'}"


def test_network_errors_read_as_one_reason():
    class Wrapped(Exception):
        def __init__(self, reason):
            super().__init__("outer")
            self.reason = reason

    assert transport._reason(Wrapped(TimeoutError("timed out"))) == "timed out (timed out)"
    assert transport._reason(Wrapped(OSError("Read timed out: read timeout=30"))) == \
        "timed out (read timeout=30)"
    assert transport._reason(ValueError("bad thing")) == "ValueError: bad thing"
    assert transport._reason(ValueError("")) == "ValueError: ValueError"
    assert len(transport._reason(ValueError("x" * 1000))) == 300


def test_a_declared_length_must_be_a_number_and_fit(tmp_path):
    for length, fragment in ((b"12x", "sent a bad Content-Length '12x'"),
                             (b"5000", "is 5,000 bytes, larger than download.max_bytes (100)")):
        response = b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\n\r\n" + CORPUS
        with raw_server(replies(response)) as base:
            with pytest.raises(PipelineError, match=re.escape(fragment)):
                fetch(f"{base}/c.txt", tmp_path / "out", 30, 100)


def test_an_unreachable_host_is_one_redacted_line(tmp_path):
    from src.core.local_servers import free_port

    url = f"http://user:pw@127.0.0.1:{free_port()}/x.zip?sig=1"
    with pytest.raises(PipelineError) as info:
        fetch(url, tmp_path / "out", 30, 100)
    shown = url.replace("user:pw", "***").replace("sig=1", "***")
    assert str(info.value) == f"download failed: cannot reach {shown} ([Errno 111] Connection " \
                              "refused)"
    assert not (tmp_path / "out").exists() or (tmp_path / "out").read_bytes() == b""



# -- what arrives, and how it is asked for ----------------------------------------------------

def header(request: str, name: str) -> str | None:
    for line in request.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


def test_a_body_of_exactly_the_limit_arrives_whole_asked_for_with_our_user_agent(tmp_path):
    """A GET with the browser-like User-Agent (manythings.org refuses bare clients); a body of
    exactly download.max_bytes is accepted, also under a deadline below a second."""
    requests = []
    with raw_server(replies(ok(CORPUS)), requests) as base:
        fetch(f"{base}/cmn.txt", tmp_path / "out", 0.9, len(CORPUS))
    assert (tmp_path / "out").read_bytes() == CORPUS
    assert requests[0].startswith("GET /cmn.txt HTTP/1.1\r\n")
    assert header(requests[0], "User-Agent") == USER_AGENT


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_each_redirect_status_is_followed(tmp_path, status):
    def respond(conn, path):
        if path == "/old":
            conn.sendall(b"HTTP/1.1 %d Moved\r\nLocation: /new\r\nContent-Length: 0\r\n\r\n"
                         % status)
        else:
            conn.sendall(ok(CORPUS))

    with raw_server(respond) as base:
        assert fetch_to(tmp_path, f"{base}/old") == CORPUS


def test_a_location_header_redirects_only_with_a_redirect_status(tmp_path):
    with_location = b"HTTP/1.1 200 OK\r\nLocation: /elsewhere\r\nContent-Length: %d\r\n\r\n"
    with raw_server(replies(with_location % len(CORPUS) + CORPUS)) as base:
        assert fetch_to(tmp_path, f"{base}/cmn.txt") == CORPUS
    no_location = b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n"
    with raw_server(replies(no_location)) as base:
        assert failure(f"{base}/cmn.txt", tmp_path / "out") == \
            f"download failed: HTTP 302 Found for {base}/cmn.txt"


def test_refused_redirects_name_both_ends_redacted():
    assert transport.redirect_target("https://a.org/x", "/y") == "https://a.org/y"
    with pytest.raises(PipelineError) as info:
        transport.redirect_target("https://u:p@a.org/x?s=1", "http://a.org/y?t=2")
    assert str(info.value) == ("download refused: https://***@a.org/x?*** redirects to "
                               "insecure http://a.org/y?***")
    with pytest.raises(PipelineError) as info:
        transport.redirect_target("http://u:p@a.org/x?s=1", "ftp://u:p@a.org/y")
    assert str(info.value) == ("download refused: http://***@a.org/x?*** redirects to "
                               "ftp://***@a.org/y")


def test_an_unsupported_scheme_is_shown_redacted(tmp_path):
    assert failure("ftp://u:p@files.example/cmn.zip?sig=1", tmp_path / "out") == \
        "unsupported URL scheme 'ftp' in ftp://***@files.example/cmn.zip?***"


# -- limits: size, deadline, stalls, a host that never answers -------------------------------

def test_a_body_without_a_length_is_cut_at_the_limit_across_reads(tmp_path):
    """No Content-Length: the cap holds on the running total of several reads, not on each."""
    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    with raw_server(replies(head, *[b"x" * 40] * 5, delay_s=0.05)) as base:
        url = base.replace("http://", "http://u:p@") + "/c.txt?sig=1"
        shown = base.replace("http://", "http://***@") + "/c.txt?***"
        assert failure(url, tmp_path / "out", max_bytes=100) == (
            f"{shown} is larger than download.max_bytes (100 bytes); raise it if this is "
            "expected")
    assert (tmp_path / "out").stat().st_size <= 100


def test_a_declared_length_of_exactly_the_limit_is_accepted(tmp_path):
    with raw_server(replies(ok(CORPUS[:100]))) as base:
        fetch(f"{base}/c.txt", tmp_path / "out", 30, 100)
    assert (tmp_path / "out").read_bytes() == CORPUS[:100]


def test_a_spent_deadline_stops_before_the_next_request(tmp_path, monkeypatch):
    """The total deadline is checked before each hop: with none left (a frozen clock, 0 s
    remaining exactly) no request is made at all."""
    monkeypatch.setattr(transport, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    requests = []
    with raw_server(replies(ok(CORPUS)), requests) as base:
        url = base.replace("http://", "http://u:p@") + "/c.txt?sig=1"
        shown = base.replace("http://", "http://***@") + "/c.txt?***"
        assert failure(url, tmp_path / "out", timeout_s=0) == (
            f"download failed: {shown} did not finish within download.timeout_s=0 s")
    assert requests == []


def test_a_trickling_body_hits_the_total_deadline(tmp_path):
    """Each piece arrives well within the stall limit; the whole takes longer than
    download.timeout_s, checked between reads."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n"
    with raw_server(replies(head, *[b"x" * 10] * 40, delay_s=0.1)) as base:
        start = time.monotonic()
        assert failure(f"{base}/c.txt", tmp_path / "out", timeout_s=1) == (
            f"download failed: {base}/c.txt did not finish within download.timeout_s=1 s")
    assert time.monotonic() - start < 3


def test_a_host_that_never_accepts_fails_after_the_stall_limit(tmp_path, monkeypatch):
    """A listening socket whose queue is full drops new connections' SYNs, so connecting hangs:
    the connect timeout (STALL_S, 0.5 s here) ends it with one line."""
    import socket

    monkeypatch.setattr(transport, "STALL_S", 0.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port))  # fills the accept queue
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(
        failure(f"http://127.0.0.1:{port}/c.txt", tmp_path / "out", timeout_s=60)), daemon=True)
    try:
        worker.start()
        worker.join(10)
    finally:
        queued.close()
        listener.close()
    assert outcome == [f"download failed: cannot reach http://127.0.0.1:{port}/c.txt "
                       "(Connection to 127.0.0.1 timed out. (connect timeout=0.5))"]


def test_a_connection_closed_early_says_how_much_arrived(tmp_path):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n"
    with raw_server(replies(head + b"x" * 10)) as base:
        assert failure(f"{base}/c.txt", tmp_path / "out") == (
            f"download failed: received 10 of 400 bytes from {base}/c.txt "
            "(connection closed early)")


def test_a_compressed_body_closed_early_is_a_protocol_error(tmp_path):
    """With Content-Encoding the declared length counts compressed bytes, so there is no
    `received x of y`: the error names the short read instead."""
    import gzip

    body = gzip.compress(CORPUS)
    head = (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
            % len(body))
    with raw_server(replies(head + body[:50])) as base:
        message = failure(f"{base}/c.txt", tmp_path / "out")
    assert message.startswith(f"download failed: {base}/c.txt: ProtocolError: ")
    assert "IncompleteRead" in message


# -- the disk, not the network ---------------------------------------------------------------

@pytest.mark.parametrize("size", [50, 20_000], ids=["fails-on-close", "fails-on-write"])
def test_a_full_disk_is_a_write_error_not_a_network_error(tmp_path, size):
    """/dev/full takes the open and fails the write (20 kB: beyond the file buffer) or the
    flush at close (50 bytes: still buffered)."""
    with raw_server(replies(ok(b"x" * size))) as base:
        assert failure(f"{base}/c.txt", Path("/dev/full")) == \
            "cannot write /dev/full: No space left on device"
    (tmp_path / "c.txt").write_bytes(b"x" * size)
    assert failure(str(tmp_path / "c.txt"), Path("/dev/full")) == (
        f"cannot copy {tmp_path / 'c.txt'} to /dev/full: No space left on device")


def test_a_destination_that_cannot_be_opened_is_named(tmp_path):
    dest = tmp_path / "missing" / "out"
    with raw_server(replies(ok(CORPUS))) as base:
        assert failure(f"{base}/c.txt", dest) == \
            f"cannot write {dest}: No such file or directory"


def test_unreachable_reasons_drop_the_connection_object():
    import urllib3

    refused = urllib3.exceptions.NewConnectionError(
        object(), "Failed to establish a new connection: [Errno 111] Connection refused")
    assert transport._unreachable(refused) == "[Errno 111] Connection refused"
    assert transport._unreachable(urllib3.exceptions.ConnectTimeoutError()) == \
        "ConnectTimeoutError"


def test_the_progress_bar_names_the_file_counts_bytes_and_is_gone_when_done(tmp_path,
                                                                            monkeypatch):
    """On a terminal: one bar, named after the file, counting received of declared bytes; it
    is erased when the download ends (transient), so logs keep only the stage's own lines."""
    import io

    import rich
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(rich, "_console", Console(file=screen, force_terminal=True, width=100,
                                                  color_system=None))
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(CORPUS)
    with raw_server(replies(head, CORPUS[:5000], CORPUS[5000:], delay_s=0.2)) as base:
        fetch(f"{base}/cmn.txt?sig=1", tmp_path / "out", 30, 10**6)
    shown = screen.getvalue()
    last_frame = shown.rsplit("\r\x1b[2K", 1)[1].split("\n")[0]
    assert re.fullmatch(r"download cmn\.txt ━{40} 10\.6/10\.6 kB (\?|[\d.]+ [kM]?B/s)",
                        last_frame), last_frame
    assert shown.endswith("\x1b[1A\x1b[2K")  # the bar's line erased
