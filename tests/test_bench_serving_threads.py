"""bench.serving_threads: the order servers run in, the requests each row sends, and the
table docs/serving.md shows, on hand-made rows and on the file the page cites."""

from __future__ import annotations

import json
import re

from helpers import REPO

from bench import serving_threads


def sittings():
    return serving_threads


def row(round_index: int, threads: int, batch: int, clients: int, speed: float, p50: float,
        errors: int = 0) -> dict:
    return {"round": round_index, "threads": threads, "batch": batch, "clients": clients,
            "requests": 10, "p50_ms": p50, "p95_ms": p50, "p99_ms": p50,
            "sentences_per_s": speed, "errors": errors}


def test_the_thread_counts_swap_order_every_round():
    assert sittings().thread_orders([1, 2], 3) == [[1, 2], [2, 1], [1, 2]]


def test_a_row_sends_its_sentences_in_requests_of_its_batch_rounded_up():
    script = sittings()
    assert [script.requests_for(b, 640) for b in (1, 32, 600, 1000)] == [640, 20, 2, 1]


def test_the_table_gives_each_counts_range_and_bolds_only_a_clear_winner():
    sitting = {"cpu": "Some CPU", "commit": "abc1234", "onnxruntime": "1.31.1",
               "model": "models:/m@candidate", "rows": [
                   row(1, 1, 1, 4, 120.0, 30.0), row(1, 2, 1, 4, 90.0, 41.0),
                   row(2, 2, 1, 4, 95.5, 40.0), row(2, 1, 1, 4, 150.0, 25.5),
                   row(1, 1, 32, 1, 240.0, 130.0), row(1, 2, 32, 1, 300.0, 100.0),
                   row(2, 2, 32, 1, 230.0, 140.0), row(2, 1, 32, 1, 250.0, 128.0, errors=1)]}
    lines = sittings().render(sitting).splitlines()
    assert lines[0] == ("Some CPU; commit abc1234; ONNX Runtime 1.31.1; models:/m@candidate; "
                        "2 round(s), lowest–highest; errors: 1.")
    assert lines[2] == ("| sentences per request | clients | 1 thread: sent/s | 2 threads: "
                        "sent/s | 1 thread: p50 ms | 2 threads: p50 ms |")
    # single sentences: one thread's worst (120) beats two threads' best (95.5)
    assert lines[4] == "| 1 | 4 | **120.0–150.0** | 90.0–95.5 | 25.5–30.0 | 40.0–41.0 |"
    # batches of 32: the ranges overlap, nobody wins
    assert lines[5] == "| 32 | 1 | 240.0–250.0 | 230.0–300.0 | 128.0–130.0 | 100.0–140.0 |"


def test_docs_serving_md_shows_what_the_script_prints_from_the_file_it_cites():
    script = sittings()
    page = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    cited = re.findall(r"python -m bench\.serving_threads table (docs/benchmarks/\S+?\.json)",
                       page)
    assert cited
    for name in cited:
        printed = script.render(json.loads((REPO / name).read_text(encoding="utf-8")))
        missing = [line for line in printed.splitlines() if line.strip() and line not in page]
        assert missing == [], f"{name}: lines of its table absent from docs/serving.md"
