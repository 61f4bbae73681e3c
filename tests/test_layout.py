"""The layout reads as the plan: no two modules share a file name, no two modules import each
other (directly or around a circle, lazy imports inside functions included), and the README's
layout table names every module."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"


def modules() -> dict[str, Path]:
    """Dotted name (below `src`) -> file, packages' `__init__.py` left out."""
    return {".".join(p.relative_to(SRC).with_suffix("").parts): p
            for p in sorted(SRC.rglob("*.py")) if p.name != "__init__.py"}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The src modules a file imports anywhere in it (top level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module.startswith("src.") or node.module == "src"):
            base = node.module.removeprefix("src").removeprefix(".")
            for alias in node.names:  # `from src.runtime import contract` names a module
                candidate = f"{base}.{alias.name}" if base else alias.name
                found.add(candidate if candidate in known else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("src.") for a in node.names if a.name.startswith("src.")}
    return found & known


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of the graph, each once, as the path around it (Tarjan would do; the
    graph is small, so a depth-first walk from each node finds them plainly)."""
    cycles, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        cycles.append(path + [start])
                elif nxt not in path and nxt > start:  # each circle from its smallest name
                    stack.append((nxt, path + [nxt]))
    return cycles


def test_the_cycle_finder_finds_a_circle_and_only_circles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in SRC.rglob("*.py") if p.name != "__init__.py")
    assert [n for n, count in names.items() if count > 1] == []


def test_no_module_imports_itself_around_a_circle():
    known = modules()
    graph = {name: imported_modules(path, set(known)) - {name} for name, path in known.items()}
    assert import_cycles(graph) == []


def test_the_readme_layout_names_every_module():
    """Each line of the layout block is `src/<package>/  module, module (what it does), ...`;
    every module of the package must be named on its package's lines."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines():
        head = re.match(r"(src/(?:\w+/)?)\s", line)
        if head:
            package = head.group(1)
        if package:
            text = re.sub(r"\([^)]*\)", "", line[len(head.group(1)):] if head else line)
            listed.setdefault(package, set()).update(re.findall(r"[a-z_0-9]+", text))
    missing = []
    for name in modules():
        package = "src/" + "".join(f"{part}/" for part in name.split(".")[:-1])
        if name.split(".")[-1] not in listed.get(package, set()):
            missing.append(name)
    assert missing == []
