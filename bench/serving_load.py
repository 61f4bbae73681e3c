"""Load test of a served translation model: p50/p95/p99 latency, sent/s and errors per batch
size and client count, beside src.infer's own throughput (`--onnx`): docs/serving.md.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import typer

from bench.common import cli_app, command, ints, run_cli, timed, write_json

app = cli_app()
FALLBACK = ["How are you?", "I like cats.", "Where is the station?", "It is raining today.",
            "She bought three books yesterday.", "We will meet after work."]


def sentence_pool(path: Path | None) -> list[str]:
    """The non-blank lines of `path`, or FALLBACK where there are none."""
    lines = path.read_text(encoding="utf-8").splitlines() if path else []
    return [s for s in lines if s.strip()] or FALLBACK


def post(url: str, sentences: list[str], timeout: float) -> tuple[bool, float]:
    """(answered 200 with one translation per sentence, seconds)."""
    body = json.dumps({"inputs": sentences}).encode()
    request = urllib.request.Request(f"{url}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            ok = resp.status == 200 and len(json.load(resp)["predictions"]) == len(sentences)
    except (OSError, ValueError, KeyError):
        ok = False
    return ok, time.perf_counter() - start


def summary(latencies: list[float], sentences: int, seconds: float, errors: int) -> dict:
    ms = np.percentile(np.array(latencies) * 1000, [50, 95, 99]) if latencies else [0, 0, 0]
    return {"p50_ms": round(float(ms[0]), 1), "p95_ms": round(float(ms[1]), 1),
            "p99_ms": round(float(ms[2]), 1),
            "sentences_per_s": round(sentences / max(seconds, 1e-9), 1), "errors": errors}


def bodies(pool: list[str], batch: int, requests: int) -> list[list[str]]:
    """`requests` requests of `batch` sentences each, going round the pool."""
    return [[pool[(i * batch + j) % len(pool)] for j in range(batch)] for i in range(requests)]


def load(url: str, pool: list[str], batch: int, clients: int, requests: int,
         timeout: float) -> dict:
    with ThreadPoolExecutor(clients) as executor:
        results, seconds = timed(lambda: list(executor.map(lambda b: post(url, b, timeout),
                                                           bodies(pool, batch, requests))))
    return summary([t for _, t in results], batch * requests, seconds,
                   sum(not ok for ok, _ in results))


def measured(url: str, pool: list[str], batch: int, clients: int, requests: int, warmup: int,
             timeout: float = 120) -> dict:
    """A row of the server at `url`: `warmup` untimed requests at its concurrency (every
    worker's first runs are slower), then `requests` timed ones."""
    if warmup:
        load(url, pool, batch, clients, warmup, timeout)
    return {"batch": batch, "clients": clients, "requests": requests} | load(
        url, pool, batch, clients, requests, timeout)


def in_process(onnx: Path, pool: list[str], batch: int, requests: int, threads: int) -> dict:
    """src.infer's translator on the same requests, one after another, no HTTP."""
    from src.runtime.generation import load_translator

    translator = load_translator(onnx, threads=threads, warn=lambda _: None)
    latencies, seconds = timed(lambda: [timed(translator.translate, sentences, batch_size=32)[1]
                                        for sentences in bodies(pool, batch, requests)])
    return {"batch": batch, "clients": 1, "requests": requests} | summary(
        latencies, batch * requests, seconds, 0)


@app.command()
def main(
    url: str = typer.Option(..., help="Base URL of `mlflow models serve`."),
    sentences: Path = typer.Option(None, help="Source sentences, one per line."),
    requests: int = typer.Option(1000, min=1, help="Requests per row."),
    clients: str = typer.Option("1,4,16", help="Concurrent clients, comma-separated."),
    batches: str = typer.Option("1,32", help="Sentences per request, comma-separated."),
    timeout: float = typer.Option(120, min=1, help="Seconds before a request counts as lost."),
    warmup: int = typer.Option(0, min=0, help="Untimed requests before each HTTP row."),
    onnx: Path = typer.Option(None, help="Also time src.infer's translator on this model."),
    threads: int = typer.Option(2, min=1, help="ONNX Runtime threads of the --onnx row."),
    json_out: Path = typer.Option(None, "--json", help="Also write the rows here."),
) -> None:
    """Print p50/p95/p99 latency, sentences/s and errors per batch size and client count."""
    pool, url = sentence_pool(sentences), url.rstrip("/")
    rows = []
    line = "{:<9} {:>5} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6}".format
    print(line("via", "batch", "clients", "p50 ms", "p95 ms", "p99 ms", "sent/s", "errors"))
    for batch in ints(batches):
        plans = [("http", c) for c in ints(clients)]
        if onnx is not None:
            plans.insert(0, ("src.infer", 1))
        for via, n_clients in plans:
            rows.append({"via": via} | (
                in_process(onnx, pool, batch, requests, threads) if via == "src.infer"
                else measured(url, pool, batch, n_clients, requests, warmup, timeout)))
            print(line(*(v for k, v in rows[-1].items() if k != "requests")), flush=True)
    if json_out:
        write_json(json_out, {"command": command(), "rows": rows})
    if any(r["errors"] for r in rows):
        raise typer.Exit(1)


if __name__ == "__main__":
    run_cli(app)
