"""bench.gpu_check, the tool a GPU owner runs: on a machine without a GPU it says so in
one line; its steps are rehearsed on the CPU on a toy project, so the script a GPU owner gets
has run end to end (only its CUDA provider and the engine benchmark have not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import toy_projects
import yaml
from helpers import REPO, TINY_PARAMS

TOOL = ("-m", "bench.gpu_check")


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, *TOOL, "--output", str(tmp_path / "o.json")],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.startswith("gpu_check: no GPU to check here (")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "o.json").exists()


def test_checks_it_cannot_make_are_refused_by_name(tmp_path):
    for args, said in ((["--checks", "parity,speeed"], "no check named speeed"),
                       (["--onnx-only", "--checks", "bleu,train"], "train cannot run")):
        result = subprocess.run([sys.executable, *TOOL, *args, "--output",
                                 str(tmp_path / "o.json")],
                                capture_output=True, text=True, timeout=120, cwd=REPO)
        assert result.returncode == 2
        assert said in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o.json").exists()


def test_onnx_only_and_pytorch_only_are_refused_together(tmp_path):
    result = subprocess.run([sys.executable, *TOOL, "--onnx-only", "--pytorch-only",
                             "--output", str(tmp_path / "o.json")],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2
    assert "--onnx-only and --pytorch-only" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o.json").exists()


def trainable_copy(exported: Path, root: Path) -> Path:
    """The shared toy project copied, with a train split (its valid pairs) and the tiny model
    of TINY_PARAMS on one thread for the train check to train."""
    from datasets import DatasetDict, load_from_disk

    from src.data.subword import ENCODED_WITH

    shutil.copytree(exported, root, ignore=shutil.ignore_patterns("tokenized"))
    splits = load_from_disk(str(exported / "data/tokenized"))
    DatasetDict({**splits, "train": splits["valid"]}).save_to_disk(str(root / "data/tokenized"))
    shutil.copy(exported / "data/tokenized" / ENCODED_WITH, root / "data/tokenized")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["model"].update(TINY_PARAMS["model"])
    params["train"]["threads"] = 1
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def run_tool(*args: str, hidden: tuple[str, ...] = (), **env: str):
    """The tool on the CPU, with the modules `hidden` made unimportable."""
    prelude = (f"import runpy, sys; sys.modules.update(dict.fromkeys({hidden!r})); "
               "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', "
               "alter_sys=True)")
    return subprocess.run([sys.executable, "-c", prelude, "bench.gpu_check", "--rehearse-on-cpu",
                           *args], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, **env})


@pytest.mark.gpu
def test_its_steps_run_end_to_end_rehearsed_on_the_cpu(exported_toy, tmp_path):
    root = trainable_copy(exported_toy, tmp_path / "p")
    out = tmp_path / "rows.json"
    result = run_tool("--root", str(root), "--sentences", "20", "--train-steps", "4",
                      "--table-sentences", "12", "--table-batches", "32", "--serve-requests",
                      "4", "--output", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    # the batch table: every engine the CPU runs x the batch sizes asked x greedy and beam 4,
    # each cell a process of its own (no GPU memory to poll here)
    table = [r for r in rows if r["check"] == "batches"]
    assert [(r["engine"], r["batch_size"], r["beam"]) for r in table] == [
        (engine, 32, beam) for engine in ("model.onnx", "pytorch") for beam in (1, 4)]
    assert all(r["sentences"] == 12 and r["sentences_per_s"] > 0 and r["device"] == "cpu"
               and r["peak_gpu_memory_mib"] is None and r["memory_of"] is None for r in table)
    # the registered MLflow model under `mlflow models serve`, load-tested where NMT_PROVIDER
    # put it (the CPU here), its server's log naming the provider that ran it
    served = [r for r in rows if r["check"] == "serve"]
    assert [(r["provider"], r["via"], r["batch"], r["clients"]) for r in served] == [
        ("cpu", "http", batch, clients) for batch in (1, 32) for clients in (1, 4)]
    assert all(r["errors"] == 0 and r["requests"] == 4 for r in served)
    assert all(r["ran_on"].startswith("CPUExecutionProvider") and "NMT_PROVIDER=cpu"
               in r["ran_on"] for r in served)
    placed = {r["file"]: r["nodes"] for r in rows if r["check"] == "placement"}
    assert set(placed) == {"model.onnx", "model.int8.onnx", "model.text.onnx",
                           "model.int8.text.onnx"}  # fp16: CUDA only
    assert all(n.startswith("CPUExecutionProvider ") and n.endswith(" nodes")
               for n in placed.values())
    parity = {r["file"]: r for r in rows if r["check"] == "parity"}
    assert parity["model.onnx"]["greedy_parity"] == 1.0 and parity["model.onnx"]["passed"]
    assert parity["model.text.onnx"]["parity_sentences"] == 20
    # each file's BLEU is what export measured for it (same translator, same batches)
    stats = json.loads((root / "models/export_stats.json").read_text())
    bleu = {r["file"]: r["bleu"] for r in rows if r["check"] == "bleu"}
    assert bleu["model.onnx"] == stats["fp32_bleu"] and bleu["model.int8.onnx"] == \
        stats["int8_bleu"]
    assert bleu["model.text.onnx"] == bleu["model.onnx"]
    trained = [r for r in rows if r["check"] == "train"]
    assert [r["precision"] in {"bf16", "fp32"} for r in trained] == [True, True]
    assert trained[1]["precision"] == "fp32" and all(r["steps"] == 4 for r in trained)
    assert report["machine"]["provider"] == "cpu"
    assert "every parity check passed" in result.stdout
    assert report["complete"] is True
    assert list(report["check_seconds"]) == ["placement", "parity", "bleu", "batches", "serve",
                                             "train"]

    # --onnx-only, mlflow missing: the check that breaks leaves a row saying why, the check
    # after it still runs and gives the same rows as above
    part = tmp_path / "part.json"
    result = run_tool("--onnx-only", "--checks", "serve,bleu", "--root", str(root),
                      "--serve-requests", "4", "--output", str(part), hidden=("mlflow",))
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1].endswith("these checks failed: serve")
    report = json.loads(part.read_text())
    assert [r["check"] for r in report["rows"]] == ["serve"] + ["bleu"] * len(bleu)
    assert "mlflow" in report["rows"][0]["error"] and report["complete"] is True
    assert {r["file"]: r["bleu"] for r in report["rows"][1:]} == bleu
    # killed halfway (as a device's time limit would), the file holds the checks that finished,
    # made in the order asked
    result = run_tool("--checks", "bleu,placement", "--root", str(root), "--output", str(part),
                      NMT_FAILPOINT="gpu_check_after_check:1")
    assert result.returncode == 137
    report = json.loads(part.read_text())
    assert report["complete"] is False and list(report["check_seconds"]) == ["bleu"]
    assert {r["check"] for r in report["rows"]} == {"bleu"}

    # --pytorch-only, as on a machine whose Python has a CUDA torch and neither onnxruntime nor
    # mlflow: neither is imported, and PyTorch's beam search scores what the ONNX file scored
    result = run_tool("--pytorch-only", "--root", str(root), "--sentences", "20",
                      "--train-steps", "4", "--output", str(out),
                      hidden=("onnxruntime", "mlflow"))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert [r["check"] for r in report["rows"]] == ["search", "search", "train", "train"]
    greedy, beam = report["rows"][:2]
    assert (greedy["beam"], beam["beam"]) == (1, toy_projects.EXPORT["beam_size"])
    assert greedy["cpu_parity"] == beam["cpu_parity"] == 1.0 and beam["passed"]
    assert beam["bleu"] == stats["fp32_bleu"] and beam["sentences"] == greedy["sentences"] > 20
    assert "onnxruntime" not in report["machine"]


def test_gpu_memory_is_read_from_nvidia_smi_for_the_process_and_the_gpu(tmp_path, monkeypatch):
    """The batch table's memory: the cell's process where nvidia-smi lists its pid, and the
    GPU's total for the fallback (a container may list host pids); nothing without the tool."""
    from bench import gpu_check

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    "  --query-compute-apps=*) printf '1234, 500\\n99, 20\\n' ;;\n"
                    "  --query-gpu=*) printf '5000\\n' ;;\nesac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert gpu_check.gpu_memory_mib(1234) == (500, 5000)
    assert gpu_check.gpu_memory_mib(7) == (None, 5000)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_check.gpu_memory_mib(1234) == (None, None)


def test_a_batch_table_cell_that_fails_is_a_row_saying_why(tmp_path, monkeypatch):
    """One cell's crash does not cost the cells measured before or after it."""
    from bench import gpu_check

    monkeypatch.setattr(gpu_check, "TABLE_ENGINES", ("pytorch",))
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    rows = gpu_check.table_rows(tmp_path, "cpu", 4, [1])  # no models/model.pt: each cell fails
    assert [(r["engine"], r["batch_size"], r["beam"]) for r in rows] == [
        ("pytorch", 1, 1), ("pytorch", 1, 4)]
    assert all(r["error"].startswith("exit 1: ") and "model.pt" in r["error"] for r in rows)


def test_the_engine_speed_check_reads_the_rows_of_the_engine_tools_sitting(tmp_path,
                                                                         monkeypatch):
    """The engine tool writes a sitting ({"command": ..., "rows": [...]}), not a list: the
    check iterated the sitting's keys and failed on a GPU."""
    from bench import common, gpu_check

    row = {"engine": "ours", "precision": "fp16", "sent_per_s": 120.5}
    sitting = common.record(rows=[row])  # as bench.engines_vs_ctranslate2 --json writes it

    def engine_tool(argv, **_):
        common.write_json(Path(argv[argv.index("--json") + 1]), sitting, indent=1)

    monkeypatch.setattr(gpu_check.subprocess, "run", engine_tool)
    assert gpu_check.speed_rows(tmp_path, tmp_path, tmp_path) == [{"check": "speed", **row}]
