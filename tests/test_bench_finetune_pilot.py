"""bench.finetune_pilot: each candidate recipe trains from the same parent in a copy of the
project with its own finetune values, the project's models/ untouched, one row per candidate from
what its run wrote; bad candidates and an unprepared project are one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from helpers import REPO, assert_one_line_error

from src.nmt import checkpoint

TOOL = ("-m", "bench.finetune_pilot")


def pilot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *TOOL, *args], capture_output=True, text=True,
                          timeout=900, cwd=REPO)


@pytest.mark.slow
def test_each_candidate_trains_from_the_parent_with_its_own_recipe(toy_parent, toy_child,
                                                                  tmp_path):
    project = shutil.copytree(toy_child, tmp_path / "child")
    out = tmp_path / "pilot"
    result = pilot("--project", str(project), "--out", str(out), "slow=1e-4,5",
                   "fast=3e-3,2,7")
    assert result.returncode == 0, result.stderr
    rows = json.loads((out / "pilot.json").read_text())["rows"]
    assert [r["candidate"] for r in rows] == ["slow", "fast"]
    assert [(r["finetune.lr"], r["finetune.warmup_steps"]) for r in rows] == [(1e-4, 5),
                                                                             (3e-3, 2)]
    assert rows[1]["finetune.epochs"] == 7 and rows[0]["finetune.epochs"] == 100  # the project's
    for r in rows:
        stats = json.loads((out / r["candidate"] / "models/train_stats.json").read_text())
        assert r["steps"] == stats["steps"] > 0 and r["valid_bleu"] == stats["valid_bleu"]
        assert len(r["valid_loss_by_epoch"]) == r["epochs"] == stats["epochs"]
        params = yaml.safe_load((out / r["candidate"] / "params.yaml").read_text())
        assert params["finetune"]["lr"] == r["finetune.lr"]
    assert rows[0]["steps"] == 40 and rows[1]["epochs"] <= 7  # max_steps; its own epochs
    # both started from the parent and went their own ways; the project trained nothing
    weights = [checkpoint.load(out / name / "models/model.pt")["model"]
               for name in ("slow", "fast")]
    parent_weights = checkpoint.load(toy_parent / "models/model.pt")["model"]
    drift = [sum(float((w[k].float() - v.float()).abs().sum()) for k, v in parent_weights.items())
             for w in weights]
    assert 0 < drift[0] < drift[1]
    assert not (project / "models/model.pt").exists()


@pytest.mark.parametrize("spec", ["C5", "C5=fast,1000", "C5=1e-3", "C5=0,100", "C 5=1e-3,10"])
def test_a_candidate_that_is_not_name_lr_warmup_is_one_line(spec, tmp_path):
    result = pilot("--out", str(tmp_path / "o"), spec)
    assert result.returncode == 2 and "NAME=LR,WARMUP[,EPOCHS]" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()


def test_a_project_without_a_resolved_parent_is_one_line(tmp_path):
    (tmp_path / "params.yaml").write_text("train: {}\n")
    result = pilot("--project", str(tmp_path), "--out", str(tmp_path / "o"), "C5=1e-3,1000")
    assert_one_line_error(result, "data/tokenized not found: set train.init_from")
    assert not (tmp_path / "o").exists()
