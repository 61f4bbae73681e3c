"""docs/benchmarks/ holds what the pages cite, and only that: every file there is named in full
by the README or a page of docs/ (a pattern such as `_s<N>` names nothing), and every file a
page names is there. The pages and the README keep to their line budgets: a page says what is
true today, and history lives in git (shared STYLE.md, "Docs that users read")."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "docs" / "benchmarks"
# `docs/benchmarks/x.json` from anywhere, `benchmarks/x.json` in a link of a page in docs/
CITATION = re.compile(r"(?<![\w/])(?:docs/)?benchmarks/([\w.\-]+\.[a-z]+)")


# Lines per page of docs/ (as `wc -l` counts them), and for all of docs/*.md together: a new
# result replaces the old one, so a page that outgrows its budget is growing a history.
LINE_BUDGETS = {"engines.md": 300, "serving.md": 350, "gpu.md": 150, "training_speed.md": 150,
                "experiments.md": 200, "results.md": 200}
TOTAL_LINE_BUDGET = 1800
README_LINE_BUDGET = 250  # a user guide: the details live in docs/


def pages() -> dict[str, str]:
    found = {"README.md": (REPO / "README.md").read_text(encoding="utf-8")}
    for page in sorted((REPO / "docs").glob("*.md")):
        found[f"docs/{page.name}"] = page.read_text(encoding="utf-8")
    return found


def cited(text: str) -> set[str]:
    return set(CITATION.findall(text))


def test_citations_are_found_only_by_their_full_name():
    text = ("Raw rows: `docs/benchmarks/engines.json`; [table](benchmarks/gpu_check.json); "
            "sittings engines_s<N>.json; docs/benchmarks/engines_s1-s3 and mybenchmarks/x.json")
    assert cited(text) == {"engines.json", "gpu_check.json"}


def test_every_benchmark_file_is_cited_by_a_page():
    names = set().union(*(cited(text) for text in pages().values()))
    uncited = sorted(p.name for p in BENCHMARKS.iterdir() if p.name not in names)
    assert uncited == [], "files in docs/benchmarks/ that no page cites (delete them or cite them)"


def test_every_cited_benchmark_file_exists():
    missing = sorted(f"{page}: {name}" for page, text in pages().items()
                     for name in cited(text) if not (BENCHMARKS / name).is_file())
    assert missing == []


def test_the_confidence_figures_of_serving_md_are_those_of_main_dvc_lock():
    """docs/serving.md quotes the confidence of the model main's dvc.lock records: when a new
    run's evaluation is committed, the page must follow it."""
    import json

    stats = json.loads((REPO / "data/eval/stats.json").read_text(encoding="utf-8"))
    page = (REPO / "docs/serving.md").read_text(encoding="utf-8")
    assert f"confidence AUROC **{stats['confidence_auroc']:.3f}**" in page
    assert f"catches **{stats['review_catch_10']:.1%}** of the worst 10%" in page


def line_counts() -> dict[str, int]:
    return {page.name: len(page.read_text(encoding="utf-8").splitlines())
            for page in sorted((REPO / "docs").glob("*.md"))}


def test_each_page_keeps_to_its_line_budget():
    counts = line_counts()
    assert set(LINE_BUDGETS) <= set(counts), "a budgeted page is gone: update LINE_BUDGETS"
    over = {name: f"{counts[name]} lines, budget {budget}"
            for name, budget in LINE_BUDGETS.items() if counts[name] > budget}
    assert over == {}, "cut narration and superseded results, not what a user needs"


def test_the_docs_keep_to_their_total_line_budget():
    counts = line_counts()
    assert sum(counts.values()) <= TOTAL_LINE_BUDGET, counts


def test_the_readme_keeps_to_its_line_budget():
    lines = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_LINE_BUDGET, f"README.md: {lines} lines, budget {README_LINE_BUDGET}"
