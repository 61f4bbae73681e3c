"""Real MLflow servers on loopback for tests: `mlflow server` (sqlite backend, artifacts in a
temp directory) and `mlflow models serve`, each with a bounded start-up wait and lifetime."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(health_url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    """Until `health_url` answers 200; fails with the end of the server's log if the server
    exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(health_url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{health_url} did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.5)


@contextmanager
def mlflow_server(workdir: Path, start_timeout_s: float = 90):
    """Yields (uri, stop): `stop()` kills the server and its workers (a server going away);
    it is called on exit whatever happens."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{workdir / 'server.db'}",
           "--artifacts-destination", str(workdir / "artifacts"), "--workers", "1"]
    log = (workdir / "server.log").open("wb")
    # its own session, so stopping it reaches the uvicorn/gunicorn workers too
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{uri}/health", proc, start_timeout_s, workdir / "server.log")
        yield uri, stop
    finally:
        stop()
        log.close()


@contextmanager
def model_server(model_uri: str, workdir: Path, env: dict[str, str],
                 start_timeout_s: float = 120, env_manager: str = "local"):
    """`mlflow models serve` of `model_uri` on loopback; yields its base URL. Killed (with its
    workers) on exit whatever happens. `env_manager` uv or virtualenv builds the model's own
    environment first (allow for it in `start_timeout_s`)."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri,
           "--env-manager", env_manager, "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    log = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/ping", proc, start_timeout_s, workdir / "serve.log")
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
