"""dvc.yaml names, for each stage, every src/ module it imports and exactly the params it reads.

Over-declaring is a bug too: a stage that declares a key it never reads re-runs (and retrains)
when that key changes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from helpers import module_file, src_imports

from src.core.params import SECTIONS

REPO = Path(__file__).resolve().parent.parent
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
SECTION_OF_CLASS = {cls.__name__: name for name, cls in SECTIONS.items()}


def stage_module(stage: str) -> str:
    """`python -m src.<module>` in the stage's cmd -> `<module>`."""
    cmd = STAGES[stage]["cmd"].split()
    assert cmd[:2] == ["python", "-m"] and cmd[2].startswith("src."), cmd
    return cmd[2].removeprefix("src.")


def expand(deps: set[str]) -> set[str]:
    """dvc.yaml's src deps as files: a folder stands for every .py file under it."""
    files = set()
    for dep in deps:
        path = REPO / dep
        files |= ({p.relative_to(REPO).as_posix() for p in path.rglob("*.py")}
                  if path.is_dir() else {dep})
    return files


def loaded_sections(module: str) -> set[str]:
    """The params sections a stage module loads, from its `load_params(XParams)` calls."""
    tree = ast.parse(module_file(f"src.{module}").read_text())
    return {
        SECTION_OF_CLASS[arg.id]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load_params"
        for arg in node.args
        if isinstance(arg, ast.Name)
    }


def attributes_read(paths: set[str]) -> set[str]:
    """Every `x.name` attribute read anywhere in these files."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
    return names


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_lists_every_imported_module(stage):
    """Exactly the files the stage runs; a package folder stands for all of its files, and is
    listed as one dep whenever the stage uses all of them (so dvc.yaml stays short)."""
    deps = {d.rstrip("/") for d in STAGES[stage]["deps"] if d.startswith("src/")}
    needed = src_imports(stage_module(stage)) | {"src/__init__.py"}
    files = expand(deps)
    assert needed == files, f"missing: {needed - files}, extra: {files - needed}"
    for package in (p for p in (REPO / "src").iterdir() if (p / "__init__.py").is_file()):
        rel = package.relative_to(REPO).as_posix()
        if expand({rel}) <= needed:
            assert rel in deps, f"{stage} uses all of {rel}/: list the folder, not its files"


def keys_read(stage: str) -> set[str]:
    """`section.key` for every key of the sections the stage loads that its code reads (as an
    attribute, in the stage module or the src/ modules it imports)."""
    module = stage_module(stage)
    # params.py reads keys of every section to validate the whole file; that is not a use.
    read = attributes_read(src_imports(module) - {"src/core/params.py"})
    return {
        f"{section}.{key}"
        for section in loaded_sections(module)
        for key in SECTIONS[section].model_fields
        if key in read
    }


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_params_are_exactly_the_keys_it_reads(stage):
    declared = set(STAGES[stage].get("params", []))
    expected = keys_read(stage)
    assert declared == expected, f"undeclared {expected - declared}, unread {declared - expected}"


EXPECTED_SECTIONS = {
    "download": {"pair", "download"},
    "split": {"pair", "split"},
    "parent": {"pair", "train"},  # train.init_from only
    "tokenize": {"pair", "tokenize"},
    # train, evaluate and export take the languages and shared_vocab from the tokenizer (a
    # declared dep), so a pair/tokenize change reaches them through its hash, not their params.
    "train": {"model", "train", "finetune"},
    "evaluate": {"evaluate"},
    "export": {"export"},
}


@pytest.mark.parametrize("stage", list(EXPECTED_SECTIONS))
def test_each_stage_reads_only_its_own_sections(stage):
    assert {key.split(".")[0] for key in STAGES[stage].get("params", [])} == (
        EXPECTED_SECTIONS[stage]
    )
