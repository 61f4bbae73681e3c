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
from helpers import src_imports
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


def third_party_imports(where: Path) -> set[str]:
    """Top-level packages imported by a file, or by every file under a folder."""
    names = set()
    for path in (where.rglob("*.py") if where.is_dir() else [where]):
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


MODULES = sorted(".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                 for p in (REPO / "src").rglob("*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_every_module_imports(module):
    importlib.import_module(module)


COMMANDS = {"download", "split", "parent", "tokenize_corpus", "train", "evaluate", "export",
            "infer", "score", "promote", "to_ctranslate2", "text_graph", "web"}


def test_the_package_root_holds_the_commands_and_no_command_imports_another():
    """`ls src` shows the commands; the library lives in the subpackages."""
    root = {p.stem for p in (REPO / "src").glob("*.py")} - {"__init__"}
    assert root == COMMANDS
    for command in sorted(COMMANDS):
        imported = {rel for rel in src_imports(command) if rel.count("/") == 1}
        assert imported == {f"src/{command}.py"}, f"src.{command} imports {imported}"


def test_the_served_model_carries_exactly_the_code_it_imports():
    """MLflow copies MODEL_CODE into the model: a module missing there fails only where the
    model is loaded; one too many may pull a package the model does not declare."""
    from src.runtime.serving import MODEL_CODE

    needed = src_imports("runtime.mlflow_model") | {"src/__init__.py"}
    assert {f"src/{rel}" for rel in MODEL_CODE} == needed


def test_the_served_model_imports_only_what_it_declares():
    """Its requirements (serving.requirements) cover every package its code imports."""
    from src.runtime.serving import MODEL_CODE, requirements

    declared_names = {r.split("==")[0] for r in requirements(text_models=True)} | {"mlflow"}
    imported = set()
    for rel in MODEL_CODE:
        imported |= third_party_imports(REPO / "src" / rel)
    missing = {name for name in imported
               if not ALTERNATIVES.get(name, {DISTRIBUTION.get(name, name)}) & declared_names}
    assert not missing, f"the model's code imports undeclared {missing}"


def test_the_project_root_is_the_checkout_when_nmt_root_is_unset():
    """paths.ROOT comes from the file's place: moving paths.py into src/core/ must not make
    every stage look for params.yaml inside src/."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "NMT_ROOT"}
    out = subprocess.run([sys.executable, "-c", "from src.core import paths; print(paths.ROOT)"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(REPO), out.stderr
