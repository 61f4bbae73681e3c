"""The README's smoke run, verbatim, on the real cmn-eng corpus: a tiny model trained for 200
steps goes through all six stages with the default gates, and every file export writes
translates with `src.infer`. A short run used to fail at export (its int8 file agreed with
model.onnx on 63.8% of sentences, both at BLEU 0.0)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import yaml
from conftest import SHARED_DATA
from helpers import REPO, git_project, sh

ARCHIVE = SHARED_DATA / "cmn-eng" / "cmn-eng.zip"


def readme_smoke_command() -> list[list[str]]:
    """The README's smoke line, split at `&&` into commands (argv lists)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(ln for ln in readme.splitlines() if ln.startswith("dvc exp run -n smoke "))
    return [shlex.split(part) for part in line.split("&&")]


def test_the_readme_smoke_command_is_short_and_uses_the_default_gates():
    commands = readme_smoke_command()
    overrides = dict(arg.split("=", 1) for arg in commands[0] if "=" in arg)
    assert "train.max_steps" in overrides
    assert not any(key.startswith(("export.", "evaluate.")) for key in overrides)


@pytest.mark.e2e
@pytest.mark.skipif(not ARCHIVE.exists(), reason=f"{ARCHIVE} not present")
def test_the_readme_smoke_run_completes_and_translates(tmp_path):
    root = git_project(tmp_path / "project", {"download.url": str(ARCHIVE)})
    dvc_run, *after = readme_smoke_command()
    output = sh(root, *dvc_run)
    assert [line for line in output.splitlines() if "is empty" in line] == []
    assert "Downloading artifacts" not in output  # MLflow's progress bars, off in stages
    # rich's bar is for terminals: in a log it printed its last state, "0 tok/s", at the end
    assert [line for line in output.splitlines() if line.startswith("train epoch")] == []
    for stage in ("download", "split", "tokenize", "train", "evaluate", "export"):
        assert f"Running stage '{stage}'" in output
    train = json.loads((root / "models/train_stats.json").read_text())
    assert train["steps"] == int(dict(a.split("=", 1) for a in dvc_run if "=" in a)
                                 ["train.max_steps"])
    export = json.loads((root / "models/export_stats.json").read_text())
    margin = yaml.safe_load((root / "params.yaml").read_text())["export"]["max_int8_drop"]
    assert export["int8_bleu"] >= export["fp32_bleu"] - margin
    assert export["int8_chrf"] >= export["fp32_chrf"] - margin
    runs = [argv for argv in after if argv[:3] == ["python", "-m", "src.infer"]]
    assert runs  # the README's `python -m src.infer "..."`
    runs += [["python", "-m", "src.infer", "--onnx", f"models/{name}", "How are you?"]
             for name in ("model.int8.onnx", "model.text.onnx", "model.int8.text.onnx")]
    for argv in runs:
        result = subprocess.run([sys.executable, *argv[1:]], cwd=root, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.splitlines()) == 1 and result.stdout.strip(), result.stdout
