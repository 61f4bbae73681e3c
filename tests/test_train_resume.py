"""train survives a kill: it resumes from models/checkpoints/last.pt; a corrupt one is named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, TINY_PARAMS, assert_one_line_error, run_stage, scratch_root

pytestmark = pytest.mark.slow
TINY = {
    **TINY_PARAMS,
    "train": {
        "epochs": 50,
        "max_steps": 40,
        "max_tokens": 1000,
        "warmup_steps": 5,
        "log_every_steps": 5,
        "threads": 1,
    },
}


@pytest.fixture(scope="module")
def tokenized_root(tmp_path_factory):
    from toy_corpus import toy_tsv

    root = scratch_root(tmp_path_factory.mktemp("resume"), **TINY)
    (root / "toy.tsv").write_text(toy_tsv(), encoding="utf-8")
    text = (
        (root / "params.yaml")
        .read_text()
        .replace("https://www.manythings.org/anki/cmn-eng.zip", str(root / "toy.tsv"))
    )
    (root / "params.yaml").write_text(text)
    for stage in ("download", "split", "tokenize"):
        assert run_stage(root, stage).returncode == 0
    return root


def test_killed_training_resumes(tokenized_root):
    root = tokenized_root
    env = {**os.environ, "NMT_ROOT": str(root), "NMT_TRACKING": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.train", "--checkpoint-every-steps", "3"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last = root / "models/checkpoints/last.pt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert last.exists(), "training never wrote a checkpoint"
    assert not (root / "models/model.pt").exists()
    result = run_stage(root, "train")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    assert '"steps": 40' in (root / "models/train_metrics.json").read_text()


def test_corrupt_checkpoint_is_named(tokenized_root):
    last = tokenized_root / "models/checkpoints/last.pt"
    last.parent.mkdir(parents=True, exist_ok=True)
    last.write_bytes(b"\x80\x02garbage")
    result = run_stage(tokenized_root, "train")
    assert_one_line_error(result, "corrupt checkpoint")
    assert "delete" in result.stderr
