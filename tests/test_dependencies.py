"""Every package the code imports is declared in pyproject.toml, and every module imports.

A package that happens to be installed by hand (as onnxscript once was) must not hide a missing
declaration: CI installs into a fresh virtual environment, and this test names the gap.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "sklearn": "scikit-learn",
                "onnxruntime_extensions": "onnxruntime-extensions"}
# ONNX Runtime is one of two distributions by platform (see pyproject.toml's markers).
ALTERNATIVES = {"onnxruntime": {"onnxruntime", "onnxruntime-gpu"}}
# Packages torch's ONNX exporter imports on its own when src.onnx_graph calls it.
IMPORTED_BY_TORCH_EXPORT = {"onnxscript"}


def declared() -> set[str]:
    """Runtime dependencies, and the optional extras a module may need (`ctranslate2` for
    src.to_ctranslate2, which says how to install it when it is missing); not `dev`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = [r for name, reqs in project["optional-dependencies"].items() if name != "dev"
              for r in reqs]
    return {Requirement(r).name.lower() for r in project["dependencies"] + extras}


def third_party_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "src"}


def test_every_imported_package_is_declared():
    deps = declared()
    missing = []
    for name in sorted(third_party_imports(REPO / "src") | IMPORTED_BY_TORCH_EXPORT):
        wanted = ALTERNATIVES.get(name, {DISTRIBUTION.get(name, name)})
        if not wanted & deps:
            missing.append(name)
    assert not missing, f"imported by src/ but not in pyproject.toml dependencies: {missing}"


@pytest.mark.parametrize("module", sorted(p.stem for p in (REPO / "src").glob("*.py")))
def test_every_module_imports(module):
    importlib.import_module(f"src.{module}")
