"""The benchmark tools that run the exported toy project's files (bench/): the engines against
CTranslate2, the file profile, decoding choices."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed (a test
    that writes into a project copies it)."""
    return exported_toy


def decoding_choices(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.decoding_choices",
                           "--root", str(project), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_engine_benchmark_checks_both_engines_agree(project, tmp_path):
    """bench.engines_vs_ctranslate2 end to end on the tiny model: CTranslate2 on the converted
    weights gives our fp32 translations on every test sentence, and each timing row names
    both engines."""
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--models",
         str(project / "models"), "--split-dir", str(project / "data/tokenized"),
         "--sentences", "8", "--threads", "1", "--beams", "1", "--batches", "4",
         "--precisions", "fp32", "--repeats", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    quality = [r for r in rows if r["kind"] == "quality"]
    assert [(r["precision"], r["identical"], r["sentences"]) for r in quality] == \
        [("fp32", 1.0, 80)]
    assert quality[0]["bleu_ours"] == quality[0]["bleu_ctranslate2"]
    speed = [r for r in rows if r["kind"] == "speed"]
    assert [(r["threads"], r["beam"], r["batch"], r["sentences"], r["repeats"])
            for r in speed] == [(1, 1, 4, 8, 2)]


def test_engine_benchmark_times_n_best_lists_and_a_baseline(project, tmp_path):
    """--n-best 2 makes both engines return two scored hypotheses (their first ones still
    agree); --baseline times our files of another dir as a third engine."""
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--models",
         str(project / "models"), "--split-dir", str(project / "data/tokenized"),
         "--sentences", "8", "--threads", "1", "--beams", "2", "--batches", "4",
         "--precisions", "fp32", "--repeats", "1", "--n-best", "2", "--baseline",
         str(project / "models"), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    quality = [r for r in rows if r["kind"] == "quality"]
    assert quality[0]["identical"] == 1.0 and quality[0]["beam"] == 4
    (speed,) = [r for r in rows if r["kind"] == "speed"]
    assert speed["n_best"] == 2 and speed["ours_baseline_sent_per_s"] > 0
    assert "ours_vs_baseline" in speed
    refused = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--beams", "1,4",
         "--n-best", "2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--n-best 2 needs every beam" in refused.stderr


def test_engine_benchmark_forces_both_engines_to_one_length(project, tmp_path):
    """--force-length 6: every pass of both engines returns exactly 6 tokens per sentence (a
    worker stops otherwise, so the run would fail), greedy and beam; no quality rows, since
    forced outputs are not translations."""
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--models",
         str(project / "models"), "--split-dir", str(project / "data/tokenized"),
         "--sentences", "8", "--threads", "1", "--beams", "1,2", "--batches", "4",
         "--precisions", "fp32", "--repeats", "1", "--force-length", "6", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kind"], r["beam"], r["force_length"]) for r in rows] == \
        [("speed", 1, 6), ("speed", 2, 6)]
    refused = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--force-length", "6",
         "--scores"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not with --scores or --n-best" in refused.stderr


def test_profile_script_shares_the_run_out_by_operator(project):
    """bench.file_profile on the tiny int8 model: the search's control nodes listed
    apart, --top leaf operators, the int8 products among them all, every share below 100%."""
    def profile(*options: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-m", "bench.file_profile",
             str(project / "models/model.int8.onnx"), "--split-dir",
             str(project / "data/tokenized"), "--top", "5", *options],
            cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    lines = profile("--sentences", "8", "--batch", "4", "--beam", "1")
    assert "8 sentences" in lines[0]
    assert any(line.split()[:2] == ["control", "Loop"] for line in lines)
    assert "ms per sentence" in lines[1]  # the share outside session.run
    leaves = [line for line in lines[2:] if not line.strip().startswith("control")]
    assert len(leaves) == 5  # the int8 products' rank among them is the CPU's: checked below
    assert all(0 < float(line.split("%")[0].split()[-1]) < 100 for line in leaves)
    # one sentence is profiled as the runtime searches it: the operator alone, no Loop
    controls = [line.split()[1]
                for line in profile("--sentences", "3", "--batch", "1", "--beam", "2")
                if line.split()[:1] == ["control"]]
    assert "BeamSearch" in controls and "Loop" not in controls and "If" not in controls
    # --scores profiles the scored translation (greedy's LogSoftmax then has rows to run on)
    def operators(*options: str) -> tuple[set[str], str]:
        lines = profile("--sentences", "8", "--batch", "4", "--beam", "1", "--top", "80",
                        *options)
        return {line.split()[0] for line in lines[2:]}, lines[0]

    plain, plain_head = operators()
    scored, scored_head = operators("--scores")
    assert "LogSoftmax" in scored and "DynamicQuantizeMatMul" in plain
    assert scored_head.endswith("scores returned") and "scores" not in plain_head


def test_the_decoding_choices_search_as_each_row_says_and_leave_params_as_they_were(project,
                                                                                  tmp_path):
    """bench.decoding_choices (docs/results.md's decoding table) on the tiny model: the
    default row first, each row's beam the one evaluate searched with on both splits, a paired
    test for every row but the default, and the project's params.yaml byte for byte after."""
    # a copy: it rewrites params.yaml while it runs, and other workers read the shared project
    project = Path(shutil.copytree(project, tmp_path / "project"))
    params = project / "params.yaml"
    before = params.read_bytes()
    out = tmp_path / "decoding.json"
    result = decoding_choices(project, "--rows", "greedy,beam5", "--json", str(out),
                              "--model-note", "the tiny test model")
    assert result.returncode == 0, result.stderr
    assert params.read_bytes() == before
    doc = json.loads(out.read_text())
    assert doc["model"] == "the tiny test model"
    assert [(r["name"], r["beam"], "valid_p_bleu" in r) for r in doc["rows"]] == [
        ("default", 4, False), ("greedy", 1, True), ("beam5", 5, True)]


def test_the_decoding_choices_refuse_a_missing_checkpoint_before_evaluating(project, tmp_path):
    out = tmp_path / "decoding.json"
    result = decoding_choices(project, "--rows", "best-checkpoint", "--json", str(out))
    assert result.returncode == 2
    assert "models/checkpoints/best.pt not found" in result.stderr.strip().splitlines()[-1]
    assert not out.exists()
