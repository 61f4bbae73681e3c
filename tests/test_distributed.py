"""Data-parallel training (torchrun + DDP, gloo on CPU): two ranks with batch B follow the same
loss curve and end at the same weights as one process with B and accumulation 2; a killed
two-rank run resumes bitwise; a rank that fails stops the run with one line."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import (
    REPO,
    TINY_PARAMS,
    fresh_copy,
    set_train_params,
    tokenize_toy,
    train_with_failpoint,
)

pytestmark = pytest.mark.slow
STEPS = 20
TINY = {
    **TINY_PARAMS,
    "model": {**TINY_PARAMS["model"], "dropout": 0.0},
    "train": {
        "epochs": 1,
        "max_steps": STEPS,
        "max_tokens": 300,  # ~50 batches in the toy epoch: 20 two-batch steps fit in it
        "warmup_steps": 5,
        "log_every_steps": 1,
        "threads": 1,
        "average_best": 1,
        "select_by": "loss",
        "nproc_per_node": 2,
        "concat_ratio": 0.0,  # the batch count above is the plain corpus's
    },
}


@pytest.fixture(scope="module")
def tokenized_root(tmp_path_factory):
    return tokenize_toy(tmp_path_factory.mktemp("ddp"), **TINY)


def train(root, failpoint: str = "", every: int = 500) -> subprocess.CompletedProcess:
    return train_with_failpoint(root, failpoint, every)


def losses(root) -> list[float]:
    with (root / "models/train_curve.csv").open() as fh:
        return [float(row["loss"]) for row in csv.DictReader(fh)]


def weights(root) -> dict[str, torch.Tensor]:
    return torch.load(root / "models/model.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def two_ranks(tokenized_root, tmp_path_factory):
    root = fresh_copy(tokenized_root, tmp_path_factory.mktemp("two") / "r")
    result = train(root)
    assert result.returncode == 0, result.stderr
    return root, result


def test_two_ranks_match_one_process_with_accumulation(tokenized_root, two_ranks, tmp_path):
    two, result = two_ranks
    assert "2 rank(s)" in result.stdout and "600 tokens" in result.stdout
    one = fresh_copy(tokenized_root, tmp_path / "one")
    set_train_params(one, nproc_per_node=1, accumulation_steps=2)
    assert train(one).returncode == 0
    a, b = losses(one), losses(two)
    assert len(a) == len(b) == STEPS
    assert max(abs(x - y) / abs(x) for x, y in zip(a, b)) < 1e-4, (a, b)
    expected, got = weights(one), weights(two)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.allclose(expected[name], got[name], rtol=1e-4, atol=1e-5), name
    # only rank 0 wrote: one checkpoint set, one metrics file
    metrics = (two / "models/train_stats.json").read_text()
    assert '"world_size": 2' in metrics and '"global_batch_tokens": 600' in metrics


@pytest.fixture(scope="module")
def killed_two_ranks(tokenized_root, tmp_path_factory) -> Path:
    """A two-rank run with dropout on, rank 0 killed as kill -9 would after its second
    periodic save (last.pt at step 12); tests resume copies of it."""
    root = fresh_copy(tokenized_root, tmp_path_factory.mktemp("killed") / "r")
    set_train_params(root, dropout=0.1)
    killed = train(root, "after_periodic_save:2", every=6)
    assert killed.returncode == 1
    assert "rank 0 of 2 exited with code 137" in killed.stderr
    assert not (root / "models/model.pt").exists()
    return root


def test_killed_two_rank_run_resumes_bitwise(tokenized_root, killed_two_ranks, tmp_path):
    """With dropout on, so each rank's random stream matters: restoring every rank's RNG state
    from last.pt is what makes the resumed run the uninterrupted one."""
    reference = fresh_copy(tokenized_root, tmp_path / "whole")
    set_train_params(reference, dropout=0.1)
    assert train(reference).returncode == 0
    root = Path(shutil.copytree(killed_two_ranks, tmp_path / "r"))
    resumed = train(root)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 12" in resumed.stdout
    expected, got = weights(reference), weights(root)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_failing_rank_stops_the_run_with_one_line(tokenized_root, tmp_path):
    root = fresh_copy(tokenized_root, tmp_path / "r")
    result = train(root, "before_validation:1@1")  # rank 1 dies, rank 0 waits for it
    assert result.returncode == 1
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines == ["error: train: rank 1 of 2 exited with code 137, so every rank was "
                     "stopped; run it again to resume from the last checkpoint"], result.stderr


def test_resume_with_another_world_size_says_what_changes(killed_two_ranks, tmp_path):
    root = Path(shutil.copytree(killed_two_ranks, tmp_path / "r"))
    set_train_params(root, nproc_per_node=1)
    result = train(root)
    assert result.returncode == 0, result.stderr
    assert "resumed with 1 ranks where last.pt was written by 2" in result.stderr
    assert '"steps": 20' in (root / "models/train_stats.json").read_text()


def test_kill_9_of_the_launcher_ends_every_rank_and_resumes_bitwise(
        tokenized_root, two_ranks, tmp_path):
    """`kill -9` of `python -m src.train` (or of dvc above it) at a random moment: no rank
    trains on as an orphan, and the next run ends where an uninterrupted one does."""
    import psutil

    root = fresh_copy(tokenized_root, tmp_path / "r")
    env = {**os.environ, "NMT_ROOT": str(root), "NMT_TRACKING": "off"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "src.train", "--checkpoint-every-steps", "3"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = root / "models/checkpoints/last.pt"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline and launcher.poll() is None:
        time.sleep(0.05)
    ranks = psutil.Process(launcher.pid).children(recursive=True)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert last.exists(), "training never wrote a checkpoint"
    assert len(ranks) >= 2
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"orphaned ranks: {alive}"
    resumed = train(root)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    expected, got = weights(two_ranks[0]), weights(root)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


# Two batches of different target lengths, so a wrong normalisation cannot cancel out.
GRAD_BATCHES = [([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15, 16, 17]]),
                ([[18, 19, 20]], [[21, 22, 23, 24, 25, 26, 27]])]


def step_gradients(rank: int, size: int, init_file: str, out_dir: str) -> None:
    """One Trainer.step of a tiny model as rank `rank` of `size` (each rank its own batch) or
    alone with both batches accumulated; saves the gradients the optimizer is handed."""
    import torch.distributed as dist

    from src.data.batching import make_batch
    from src.nmt.model import ModelConfig, Transformer
    from src.training.distributed import World
    from src.training.precision import Precision
    from src.training.resume import ResumeStore
    from src.training.step import Trainer

    torch.set_num_threads(1)
    if size > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=size)
    from helpers import train_cfg

    torch.manual_seed(0)
    model = Transformer(ModelConfig(40, 40, d_model=16, n_heads=2, n_layers=1, ffn_dim=32,
                                    dropout=0.0, share_source_embedding=True))
    trainer = Trainer(model, train_cfg(clip_norm=0.0), torch.device("cpu"), 10,
                      ResumeStore(Path(out_dir) / f"ckpt{rank}", {}, ""), 1,
                      World(rank, size, rank, size), Precision("fp32", "cpu", "test"))
    grads = {}
    step = trainer.optimizer.step

    def record_then_step(*args, **kwargs):
        grads.update({n: p.grad.clone() for n, p in model.named_parameters()})
        return step(*args, **kwargs)

    trainer.optimizer.step = record_then_step
    # the scheduler warns that step() was replaced after it was built: here on purpose
    warnings.filterwarnings("ignore", "Seems like `optimizer.step\\(\\)` has been overridden")
    batches = [make_batch(*b, max_positions=16) for b in GRAD_BATCHES]
    n_target = sum(int((b.tgt_out != 0).sum()) for b in batches)
    mine = batches if size == 1 else [batches[rank]]
    trainer.step(mine, n_target)
    torch.save(grads, Path(out_dir) / f"grads-{size}-{rank}.pt")
    if size > 1:
        dist.destroy_process_group()


def test_two_ranks_hand_the_optimizer_the_gradients_of_one_process_with_accumulation(
        tmp_path, monkeypatch):
    """Compared before AdamW (which with clipping hardly notices a constant gradient scale): a
    wrong world-size factor in the loss normalisation fails here."""
    import torch.multiprocessing as mp

    monkeypatch.syspath_prepend(str(REPO / "tests"))
    step_gradients(0, 1, "", str(tmp_path))
    mp.spawn(step_gradients, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    alone = torch.load(tmp_path / "grads-1-0.pt")
    for rank in (0, 1):
        ranked = torch.load(tmp_path / f"grads-2-{rank}.pt")
        assert alone.keys() == ranked.keys()
        for name in alone:
            assert torch.allclose(alone[name], ranked[name], rtol=1e-5, atol=1e-7), name
