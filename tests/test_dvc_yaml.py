"""dvc.yaml names, for each stage, every src/ module it imports and exactly the params it reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from src.params import SECTIONS

REPO = Path(__file__).resolve().parent.parent
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def src_imports(module: str, seen: set[str] | None = None) -> set[str]:
    """Every src/ module `module` imports, transitively, as repo-relative paths."""
    seen = set() if seen is None else seen
    path = f"src/{module}.py"
    if path in seen:
        return seen
    seen.add(path)
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "src":
                names = [a.name for a in node.names]
            elif node.module.startswith("src."):
                names = [node.module.split(".", 1)[1]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".", 1)[1] for a in node.names if a.name.startswith("src.")]
        for name in names:
            if (REPO / f"src/{name}.py").exists():
                src_imports(name, seen)
    return seen


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_lists_every_imported_module(stage):
    deps = {d for d in STAGES[stage]["deps"] if d.startswith("src/")}
    needed = src_imports(stage) | {"src/__init__.py"}
    assert needed == deps, f"missing: {needed - deps}, extra: {deps - needed}"


def loaded_sections(stage: str) -> set[str]:
    """The params sections a stage module passes to `load_params(...)`."""
    tree = ast.parse((REPO / f"src/{stage}.py").read_text())
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load_params"
        for arg in node.args
        if isinstance(arg, ast.Constant)
    }


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_params_are_exactly_the_keys_it_loads(stage):
    """The loader validates whole sections, so a stage reads every key of each one it loads."""
    expected = {
        f"{section}.{key}"
        for section in loaded_sections(stage)
        for key in SECTIONS[section].model_fields
    }
    assert set(STAGES[stage].get("params", [])) == expected
