"""A raw HTTP server on 127.0.0.1 for download tests: each reply written by hand, byte for byte,
so that broken servers (short bodies, stalls, bad headers, redirect loops) are easy to play."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

CORPUS = "".join(f"Sentence {i}.\t第{i}句。\n" for i in range(400)).encode("utf-8")


@contextmanager
def raw_server(respond, requests: list[str] | None = None):
    """Serve `respond(conn, path)` on 127.0.0.1; yields the base URL. Each request's head (request
    line and headers) is appended to `requests` when given."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                try:
                    request = conn.recv(65536).decode("latin-1")
                    if requests is not None:
                        requests.append(request)
                    respond(conn, request.split(" ")[1] if " " in request else "/")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def replies(*parts: bytes, delay_s: float = 0.0):
    def respond(conn, path):
        for part in parts:
            conn.sendall(part)
            time.sleep(delay_s)
    return respond
