"""bench.engine_tables: the tables of docs/engines.md, from sitting files and from the
merged files under docs/benchmarks/ ({"sittings": [...]}), on hand-made rows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from bench import engine_tables
from bench.common import read_sittings

REPO = Path(__file__).resolve().parent.parent


def load_sittings():
    return engine_tables


def speed(threads: int, ours: float, theirs: float, precision: str = "int8") -> dict:
    return {"kind": "speed", "precision": precision, "beam": 1, "batch": 1, "threads": threads,
            "ours_sent_per_s": ours, "ctranslate2_sent_per_s": theirs,
            "ours_vs_ctranslate2": round(ours / theirs, 2)}


def quality(bleu_ctranslate2: float) -> dict:
    return {"kind": "quality", "precision": "int8", "beam": 4, "batch": 32, "sentences": 2104,
            "bleu_ours": 40.84, "bleu_ctranslate2": bleu_ctranslate2, "identical": 0.9149}


FIRST = {"command": "python -m bench.engines_vs_ctranslate2 --json a.json", "commit": "abc1234",
         "machine": "Some CPU, 2 cores",
         "rows": [quality(40.64), speed(1, 330.0, 415.0), speed(2, 300.0, 57.0)]}
SECOND = {"command": "python -m bench.engines_vs_ctranslate2 --json b.json", "commit": "abc1234",
          "machine": "Some CPU, 2 cores",
          "rows": [quality(40.7), speed(1, 340.0, 170.0), speed(2, 350.0, 60.0)]}

REPORT = """\
2 sittings: commit abc1234; Some CPU, 2 cores.
Test split (2104 sentences), ours / CTranslate2: int8 beam 4 batch 32: 91.5% identical, BLEU \
40.84 / 40.64–40.7.

| precision, beam, batch, threads | sitting 1 | sitting 2 | worst ratio |
|---|---|---|---|
| int8 1 1, 1 | 330.0 / 415.0 (0.8) | 340.0 / 170.0 (2.0) | 0.8 |
| int8 1 1, 2 | 300.0 / 57.0 (5.26) | 350.0 / 60.0 (5.83) | 5.26 |

| precision, beam, batch | sitting 1 | sitting 2 | worst ratio |
|---|---|---|---|
| int8 1 1 | 330.0 (1t) / 415.0 (1t) (0.8) | 350.0 (2t) / 170.0 (1t) (2.06) | 0.8 |
"""


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def run(*args) -> str:
    result = subprocess.run([sys.executable, "-m", "bench.engine_tables", *map(str, args)],
                            capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
    return result.stdout


def test_each_cell_is_judged_by_its_worst_sitting():
    sittings = load_sittings()
    rows = [sittings.rows_of(s, "speed") for s in (FIRST, SECOND)]
    cells = sittings.cell_table(rows)
    assert cells[2] == "| int8 1 1, 1 | 330.0 / 415.0 (0.8) | 340.0 / 170.0 (2.0) | 0.8 |"
    best = sittings.best_thread_table(rows)
    # each engine at its own faster thread count: ours 330 (1t) vs CTranslate2 415 (1t)
    assert best[2] == ("| int8 1 1 | 330.0 (1t) / 415.0 (1t) (0.8) | "
                       "350.0 (2t) / 170.0 (1t) (2.06) | 0.8 |")


def test_a_merged_file_prints_what_its_sitting_files_print(tmp_path):
    a, b = write(tmp_path / "a.json", FIRST), write(tmp_path / "b.json", SECOND)
    merged = tmp_path / "merged.json"
    assert run(a, b, "--merge", merged) == REPORT
    # the merged file holds each sitting's file unchanged, in the order given
    assert json.loads(merged.read_text()) == {"sittings": [FIRST, SECOND]}
    assert run(merged) == REPORT
    # a merged file and a sitting file together: their sittings in order
    assert run(write(tmp_path / "one.json", {"sittings": [FIRST]}), b) == REPORT


def test_a_sitting_without_commit_or_machine_is_only_counted():
    sittings = load_sittings()
    assert sittings.heading([{"rows": []}]) == ["1 sitting."]


def test_score_cost_table_gives_each_engines_cost_and_their_speeds_with_scores(tmp_path):
    def cost(engine: str, ratio: float, scored: float, threads: int = 1) -> dict:
        return {"kind": "score_cost", "engine": engine, "precision": "int8", "threads": threads,
                "beam": 1, "batch": 32, "sentences": 300, "rounds": 8,
                "plain_sent_per_s": round(scored / ratio, 1), "scored_sent_per_s": scored,
                "scored_vs_plain": ratio, "ratio_range": [ratio, ratio]}

    merged = write(tmp_path / "cost.json", {"sittings": [
        {"commit": "abc1234", "rows": [cost("ours", 0.942, 3840.8),
                                       cost("ctranslate2", 0.931, 3592.4),
                                       cost("ours", 0.99, 5000.0, threads=2)]},
        {"commit": "def5678", "rows": [cost("ours", 0.949, 3661.9),
                                       cost("ctranslate2", 0.97, 3448.1)]}]})
    assert run(merged) == """\
2 sittings: commit abc1234, def5678.

| precision, beam, batch, threads | sitting 1 | sitting 2 | worst, ours | worst, CTranslate2 \
| with scores, ours / CTranslate2, worst |
|---|---|---|---|---|---|
| int8 1 32, 1 | **0.942** / **0.931** | **0.949** / 0.970 | **0.942** | **0.931** | 1.06 |
"""


def test_every_table_docs_engines_md_shows_is_what_the_script_prints_from_its_file():
    """docs/engines.md says each table is the exact output of the command above it: a table
    edited by hand, or a sitting file changed after its table was pasted, fails here."""
    engine_sittings = load_sittings()
    page = (REPO / "docs" / "engines.md").read_text(encoding="utf-8")
    files = re.findall(r"python -m bench\.engine_tables (docs/benchmarks/\S+?\.json)", page)
    assert len(set(files)) >= 5
    for name in sorted(set(files)):
        printed = engine_sittings.report(read_sittings(REPO / name))
        missing = [line for line in printed.splitlines() if line.strip() and line not in page]
        assert missing == [], f"{name}: lines its table should show, absent from the page"
