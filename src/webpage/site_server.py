"""Serves a built site over HTTP with the headers ONNX Runtime Web's threads need.

WebAssembly threads share memory (SharedArrayBuffer), which browsers allow only on a
cross-origin isolated page: served with `Cross-Origin-Opener-Policy: same-origin` and
`Cross-Origin-Embedder-Policy: require-corp`. Without them the page still works, on one thread.
"""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

from src.core.errors import PipelineError

ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}
TYPES = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
         ".onnx": "application/octet-stream", ".b64": "text/plain", ".json": "application/json"}


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **TYPES}

    def end_headers(self) -> None:
        for name, value in ISOLATION_HEADERS.items():
            self.send_header(name, value)
        self.send_header("Cache-Control", "no-cache")  # a rebuilt site is seen at once
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        if args and str(args[1]).startswith(("4", "5")):  # failed requests only
            super().log_message(format, *args)


def make_server(site: Path, host: str, port: int) -> http.server.ThreadingHTTPServer:
    if not (site / "index.html").is_file() or not (site / "config.json").is_file():
        raise PipelineError(f"{site} is not a built site (no index.html and config.json): run "
                            "`python -m src.web build` first")
    handler = functools.partial(SiteHandler, directory=str(site))
    try:
        return http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise PipelineError(f"cannot serve on {host}:{port}: {exc.strerror}") from None
