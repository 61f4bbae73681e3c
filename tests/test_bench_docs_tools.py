"""The small tools of bench/ that docs name for a number: mutation_score (docs/testing.md), on
hand-made inputs; `python -m bench` lists every tool; the package keeps to its line budget."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from bench import mutation_score

REPO = Path(__file__).resolve().parent.parent


def test_mutation_copy_renames_our_package_and_nothing_else():
    mutation = mutation_score
    text = ("from src.core import paths\nimport src.train\nresrc.x = 'src/data/hub.py'\n"
            "batch = src.shape[0]\nsrc.to(device)\nsource_paths = [\"src/\"]\n")
    assert mutation.OURS.sub(mutation.RENAMED, text) == (
        "from nmtsrc.core import paths\nimport nmtsrc.train\nresrc.x = 'nmtsrc/data/hub.py'\n"
        "batch = src.shape[0]\nsrc.to(device)\n"  # a variable named src keeps its name
        "source_paths = [\"nmtsrc/\"]\n")


def test_mutation_scores_count_each_modules_mutants_by_outcome(tmp_path):
    """mutmut's exit codes per mutant, read back per module under our package's own name."""
    mutation = mutation_score
    folder = tmp_path / "mutants" / "nmtsrc" / "data"
    folder.mkdir(parents=True)
    # mutmut: 1 = killed (the tests failed), 0 = survived, 24 = timeout
    (folder / "hub.py.meta").write_text(json.dumps(
        {"exit_code_by_key": {"a": 1, "b": 1, "c": 0, "d": 24}}))
    (folder / "mixing.py.meta").write_text(json.dumps({"exit_code_by_key": {}}))
    assert mutation.scores(tmp_path) == {
        "src/data/hub.py": Counter({"killed": 2, "survived": 1, "timeout": 1})}


def test_mutation_json_keeps_the_modules_a_run_did_not_mutate(tmp_path):
    mutation = mutation_score
    path = tmp_path / "mutation.json"
    row = {"mutants": 10, "killed": 9, "survived": 1, "no_tests": 0, "score": 90.0}
    path.write_text(json.dumps({"command": "old", "rows": [
        {"module": "src/a.py", **row}, {"module": "src/c.py", **row}]}))
    fresh = {"module": "src/c.py", "mutants": 4, "killed": 4, "survived": 0, "no_tests": 0,
             "score": 100.0}
    got = mutation.merged(path, [fresh, {"module": "src/b.py", **row}], "new")
    assert got["command"] == "new"
    assert [r["module"] for r in got["rows"]] == ["src/a.py", "src/b.py", "src/c.py"]
    assert got["rows"][2] == fresh
    assert mutation.merged(tmp_path / "none.json", [fresh], "x")["rows"] == [fresh]


def test_the_testing_docs_table_is_the_one_the_script_writes_from_its_json(tmp_path):
    mutation = mutation_score
    rows = json.loads((REPO / "docs/benchmarks/mutation.json").read_text())["rows"]
    doc = (REPO / "docs/testing.md").read_text(encoding="utf-8")
    start = doc.index(mutation.TABLE_START) + len(mutation.TABLE_START)
    assert doc[start:doc.index(mutation.TABLE_END)].strip() == mutation.mutation_table(rows)
    # and the script rewrites only that block
    copy = tmp_path / "testing.md"
    copy.write_text(f"before\n{mutation.TABLE_START}\nstale\n{mutation.TABLE_END}\nafter\n")
    mutation.write_table(copy, rows[:1])
    text = copy.read_text()
    assert text.startswith(f"before\n{mutation.TABLE_START}\n| module |")
    assert text.endswith(f"{mutation.TABLE_END}\nafter\n") and "stale" not in text
    total = rows[0]
    assert f"| **all** | {total['mutants']} | {total['killed']} |" in text


def test_python_m_bench_lists_every_tool_with_a_page_and_files_that_exist():
    """Each tool's first docstring paragraph, which `python -m bench` lists, names a page of
    docs/, and every docs/ path it names is there (a pattern matches at least one file)."""
    from bench.__main__ import listing, tools

    found = tools()
    assert set(found) == {p.stem for p in (REPO / "bench").glob("*.py")} - {
        "__init__", "__main__", "common"}
    for name, what in found.items():
        # docs/x.md, docs/benchmarks/x.json, docs/benchmarks/engines_*.json, docs/experiments.jsonl
        named = re.findall(r"docs/[\w/*.-]*\w", what)
        assert any(path.endswith(".md") for path in named), f"{name} names no page: {what}"
        for path in named:
            assert list(REPO.glob(path)), f"{name}: {path}"
        assert f"\n{name}\n" in listing()


# The benchmark package's size, as `wc -l bench/*.py` counts it: the tools share bench/common.py
# instead of each growing its own copy of a helper.
TOOLING_LINE_BUDGET = 3300


def test_the_benchmark_tools_keep_to_their_line_budget():
    lines = {path.name: len(path.read_text(encoding="utf-8").splitlines())
             for path in (REPO / "bench").glob("*.py")}
    assert sum(lines.values()) <= TOOLING_LINE_BUDGET, sorted(lines.items(), key=lambda kv: -kv[1])


def test_the_web_table_is_what_the_tool_writes_from_its_file():
    from bench.web_page_speed import MARKER, table

    page = (REPO / "docs/web.md").read_text(encoding="utf-8")
    sitting = json.loads((REPO / "docs/benchmarks/web_page.json").read_text())
    assert page.split(MARKER)[1].strip() == table(sitting)
