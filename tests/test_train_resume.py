"""train survives a kill at every dangerous point and ends bitwise where an uninterrupted run
ends; a params change never deletes checkpoints; a corrupt last.pt is named."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from helpers import (
    REPO,
    TINY_PARAMS,
    assert_one_line_error,
    clean_environ,
    fresh_copy,
    run_stage,
    set_train_params,
    tokenize_toy,
    train_with_failpoint,
)

pytestmark = pytest.mark.slow
TINY = {
    **TINY_PARAMS,
    "train": {
        "epochs": 3,
        "max_steps": 0,
        "max_tokens": 1000,
        "warmup_steps": 5,
        "log_every_steps": 5,
        "threads": 1,
        "average_best": 2,
        "select_by": "bleu",
        # Resume mechanics under the schedule in which train.epochs is a free key, on the
        # plain corpus; the committed recipe's own schedule and augmentation may differ.
        "schedule": "inverse_sqrt",
        "concat_ratio": 0.0,
    },
}


@pytest.fixture(scope="module")
def tokenized_root(tmp_path_factory):
    return tokenize_toy(tmp_path_factory.mktemp("resume"), **TINY)


train = train_with_failpoint  # (root, failpoint="", every=None): the name every test reads


def weights(root):
    return torch.load(root / "models/model.pt", weights_only=True)["model"]


def steps_per_epoch(root) -> int:
    rows = (root / "models/valid_curve.csv").read_text().splitlines()[1:]
    return int(rows[0].split(",")[1])


@pytest.fixture(scope="module")
def uninterrupted(tokenized_root, tmp_path_factory):
    root = fresh_copy(tokenized_root, tmp_path_factory.mktemp("clean") / "r")
    result = train(root)
    assert result.returncode == 0, result.stderr
    return root


# Each point is reached with last.pt on disk, in the order a run reaches them; `:N` is the
# N-th time the point is reached in that process, which resumed where the previous kill left
# it (a resumed run first validates the epoch whose validation the kill cut short).
KILL_POINTS = [
    "after_periodic_save:3",  # mid-epoch 1
    "before_validation:1",  # last.pt saved on epoch 1's last batch, validation not begun
    "during_validation:2",  # epoch 2's (the (old) UnboundLocalError `loss` after this kill)
    "after_epoch_checkpoint:1",  # epoch 2's file and best.pt written, ranking not yet saved
    "after_epoch_save:2",  # epoch 3's new ranking saved, dropped epoch files not yet deleted
    "during_averaging:1",
]


def test_a_run_killed_at_every_point_in_turn_resumes_bitwise_equal(tokenized_root,
                                                                    uninterrupted, tmp_path):
    """Killed as `kill -9` would at each point in turn, each time resumed from what the kill
    left: the run ends bit for bit where an uninterrupted one does, with the same checkpoints."""
    root = fresh_copy(tokenized_root, tmp_path / "r")
    rows = (uninterrupted / "models/valid_curve.csv").read_text().splitlines()[1:]
    end_1, end_2, end_3 = (int(row.split(",")[1]) for row in rows)  # steps at epoch ends
    # (step, finished epochs) in last.pt as each kill leaves it: the point was where it says
    left = [(3, 0), (end_1, 0), (end_2, 1), (end_2, 1), (end_3, 3), (end_3, 3)]
    for n, (point, state) in enumerate(zip(KILL_POINTS, left)):
        killed = train(root, point)
        assert killed.returncode == 137, (point, killed.stderr)
        assert ("resumed from" in killed.stdout) == (n > 0), point
        assert not (root / "models/model.pt").exists()
        saved = torch.load(root / "models/checkpoints/last.pt", weights_only=True)["state"]
        assert (saved["step"], saved["epoch"]) == state, point
    resumed = train(root)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    expected, got = weights(uninterrupted), weights(root)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert sorted(p.name for p in (root / "models/checkpoints").iterdir()) == sorted(
        p.name for p in (uninterrupted / "models/checkpoints").iterdir()
    )


STOPS = {"SIGTERM": (143, "error: terminated (SIGTERM)"), "SIGINT": (130, "error: interrupted")}


def test_a_stop_saves_every_finished_step_and_resumes_bitwise(tokenized_root, uninterrupted,
                                                              tmp_path):
    """`kill` or Ctrl-C in the middle of a step (after the backward pass, before the optimizer
    update) or during validation, with no periodic save in the epoch: the step is finished,
    last.pt is saved after it, and the run resumed after each stop in turn ends bit for bit
    where the uninterrupted one does. Before, a stop threw away every step since the last save
    (a real run: 193 steps)."""
    root = fresh_copy(tokenized_root, tmp_path / "r")
    rows = (uninterrupted / "models/valid_curve.csv").read_text().splitlines()[1:3]
    end_1, end_2 = (int(row.split(",")[1]) for row in rows)  # steps at the end of epochs 1, 2
    # (failpoint, signal, step stopped at, batch in epoch 2): two steps into epoch 2, three
    # more in the process resumed there, then epoch 2's validation (the resumed run's first)
    stops = [(f"during_step:{end_1 + 2}", "SIGTERM", end_1 + 2, 2),
             ("during_step:3", "SIGINT", end_1 + 5, 5),
             ("during_validation:1", "SIGTERM", end_2, end_2 - end_1)]
    resumed_at = None
    for failpoint, stop, step, batch in stops:
        stopped = train(root, f"{failpoint}={stop}", every=100_000)
        code, message = STOPS[stop]
        assert stopped.returncode == code, stopped.stderr
        assert stopped.stderr.strip().splitlines()[-1] == message, stopped.stderr
        assert f"stopped at step {step}; saved" in stopped.stdout
        assert resumed_at is None or f"at step {resumed_at}," in stopped.stdout
        state = torch.load(root / "models/checkpoints/last.pt", weights_only=True)["state"]
        assert (state["step"], state["epoch"], state["batch_in_epoch"]) == (step, 1, batch)
        resumed_at = step
    resumed = train(root)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and f"at step {resumed_at}," in resumed.stdout
    expected, got = weights(uninterrupted), weights(root)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_resume_at_max_steps_takes_no_extra_step(tokenized_root, uninterrupted, tmp_path):
    """Killed right after the periodic save that reached train.max_steps, before validation:
    the resumed run validates and stops at exactly max_steps (it used to take one more)."""
    root = fresh_copy(tokenized_root, tmp_path / "r")
    max_steps = steps_per_epoch(uninterrupted) + 2  # two steps into epoch 2
    params = (root / "params.yaml").read_text().replace("max_steps: 0", f"max_steps: {max_steps}")
    (root / "params.yaml").write_text(params)
    assert train(root, "before_validation:2").returncode == 137
    resumed = train(root)
    assert resumed.returncode == 0, resumed.stderr
    assert f'"steps": {max_steps},' in (root / "models/train_stats.json").read_text()


def test_raising_epochs_continues_a_finished_run(tokenized_root, uninterrupted, tmp_path):
    """train.epochs does not shape the trajectory (inverse-sqrt schedule): 3 epochs, then
    epochs: 4 resumes at epoch 4 and keeps every checkpoint, instead of wiping them. Its
    estimate, at the first progress line (every 5 steps) after 5 steps of its own, covers
    what is left: the rest of epoch 4 and two validations (epoch 4's, the averaged model's)."""
    root = fresh_copy(tokenized_root, tmp_path / "r")
    shutil.copytree(uninterrupted / "models/checkpoints", root / "models/checkpoints")
    params = (root / "params.yaml").read_text().replace("epochs: 3", "epochs: 4")
    (root / "params.yaml").write_text(params.replace("threads: 1", "threads: 2"))
    result = train(root)
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout and "epoch 4" in result.stdout
    assert "used 1" in result.stderr  # the thread change is said, not hidden
    metrics = (root / "models/train_stats.json").read_text()
    assert '"epochs": 4' in metrics and '"threads": 2' in metrics
    resumed_at = int((root / "models/valid_curve.csv").read_text().splitlines()[3].split(",")[1])
    estimated_at = (resumed_at + 5 + 4) // 5 * 5  # the first multiple of 5 from resumed_at + 5
    left = json.loads(metrics)["steps"] - estimated_at
    # epoch 4 is in both directions while the committed train.bidirectional_epochs is above 3
    assert re.search(rf"left for epoch 4( \(both ways\))?: {left} steps at .* \+ 2 validations, "
                     "not timed yet", result.stdout), result.stdout


def test_a_kill_leaves_no_temporary_checkpoint_files(tokenized_root, tmp_path):
    root = fresh_copy(tokenized_root, tmp_path / "r")
    ckpts = root / "models/checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / ".last.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    assert train(root, "after_periodic_save:1").returncode == 137
    assert not list(ckpts.glob(".*.tmp"))


def test_checkpoint_every_zero_steps_is_a_usage_error(tokenized_root):
    result = train(tokenized_root, every=0)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--checkpoint-every-steps" in result.stderr


def test_killed_by_a_signal_mid_run_resumes(tokenized_root, uninterrupted, tmp_path):
    """A real SIGKILL at a random moment (not a failpoint) resumes, to the uninterrupted run's
    weights bit for bit."""
    root = fresh_copy(tokenized_root, tmp_path / "r")
    env = {**os.environ, "NMT_ROOT": str(root), "NMT_TRACKING": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.train", "--checkpoint-every-steps", "3"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    last = root / "models/checkpoints/last.pt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert last.exists(), "training never wrote a checkpoint"
    result = run_stage(root, "train")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    expected, got = weights(uninterrupted), weights(root)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def first_checkpoint(root, proc: subprocess.Popen):
    """Wait until the training `proc` started in `root` has saved last.pt; its path."""
    last = root / "models/checkpoints/last.pt"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "training ended before it could be stopped"
    return last


@pytest.mark.parametrize(("stop", "code", "message"), [
    (signal.SIGTERM, 143, "error: terminated (SIGTERM)"),
    (signal.SIGINT, 130, "error: interrupted")])
def test_a_stopped_run_ends_killed_in_mlflow_and_says_why(tokenized_root, tmp_path, stop, code,
                                                           message):
    """`kill` (SIGTERM, as a scheduler or CI timeout sends) or Ctrl-C mid-training: one error
    line and 128 + the signal as exit code (typer 0.29 alone exits 130 silently for both), and
    the MLflow stage and repro runs end KILLED. Before, SIGTERM left them RUNNING forever."""
    import sqlite3

    root = fresh_copy(tokenized_root, tmp_path / "r")
    # Far more epochs than it will run: 3 end ~2 s after the first checkpoint, and on a loaded
    # machine the stop then landed while the runs were being closed, a different case (below)
    set_train_params(root, epochs=300)
    env = {**clean_environ(), "NMT_ROOT": str(root), "NMT_TRACKING": "on",
           "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.train", "--checkpoint-every-steps", "3"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    first_checkpoint(root, proc)
    proc.send_signal(stop)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == message, stderr
    with sqlite3.connect(root / "mlflow.db") as db:
        statuses = dict(db.execute("SELECT name, status FROM runs").fetchall())
    assert statuses.pop("train") == "KILLED", stderr
    assert list(statuses.values()) == ["KILLED"], stderr  # the repro run around it
    if stop == signal.SIGINT:  # and it resumes as after any stop (both stops save alike,
        # test_a_stop_saves_every_finished_step_and_resumes_bitwise: one resume is enough here)
        set_train_params(root, epochs=3)  # (epochs do not shape the trajectory: a free key)
        assert run_stage(root, "train").returncode == 0


def test_training_stops_when_the_dvc_process_running_it_is_killed(tokenized_root, tmp_path):
    """DVC does not pass SIGTERM on to its stage: `kill <dvc pid>` left training running,
    unrecorded, beside the next `dvc repro`. A stand-in `dvc` (a script of that name, as
    dvc_run.dvc_process recognises it) starts train and is killed; train stops at its next
    step with the stop's exit code and keeps its checkpoint for the resume."""
    root = fresh_copy(tokenized_root, tmp_path / "r")
    set_train_params(root, epochs=300)
    stand_in = tmp_path / "bin" / "dvc"
    stand_in.parent.mkdir()
    stand_in.write_text(
        "import subprocess, sys\n"
        "train = subprocess.Popen([sys.executable, '-m', 'src.train', "
        "'--checkpoint-every-steps', '3'], stdout=subprocess.DEVNULL, "
        f"stderr=open({str(tmp_path / 'train.err')!r}, 'w'))\n"
        f"open({str(tmp_path / 'train.pid')!r}, 'w').write(str(train.pid))\n"
        "train.wait()\n")
    env = {**clean_environ(), "NMT_ROOT": str(root), "NMT_TRACKING": "off"}
    dvc = subprocess.Popen([sys.executable, str(stand_in)], cwd=REPO, env=env)
    last = first_checkpoint(root, dvc)
    train = psutil.Process(int((tmp_path / "train.pid").read_text()))
    dvc.kill()
    dvc.wait()
    try:  # an orphan's exit code goes to whoever adopts it: the message is what we can see
        train.wait(timeout=120)
    except psutil.TimeoutExpired:
        train.kill()
        pytest.fail("training went on after the dvc process running it was killed")
    err = (tmp_path / "train.err").read_text().strip().splitlines()
    assert err[-2:] == ["stopping: the dvc process running this stage ended",
                        "error: terminated (SIGTERM)"], err
    assert last.exists()


def test_corrupt_checkpoint_is_named(tokenized_root, tmp_path):
    root = fresh_copy(tokenized_root, tmp_path / "r")
    last = root / "models/checkpoints/last.pt"
    last.parent.mkdir(parents=True, exist_ok=True)
    last.write_bytes(b"\x80\x02garbage")
    result = run_stage(root, "train")
    assert_one_line_error(result, "corrupt checkpoint")
    assert "move" in result.stderr


def test_same_seed_twice_gives_identical_split_tokenizer_ids_and_model(uninterrupted, tmp_path):
    from datasets import load_from_disk

    # the stages run again, not a copy of the tokenized project the module's tests share
    again = tokenize_toy(tmp_path / "again", reuse=False, **TINY)
    assert train(again).returncode == 0
    for name in ("split", "tokenized"):
        first, second = (load_from_disk(str(r / "data" / name)) for r in (uninterrupted, again))
        for part in ("train", "valid", "test"):
            assert first[part].to_dict() == second[part].to_dict(), (name, part)
        # byte for byte, as DVC hashes them: datasets' state.json carried a fingerprint of
        # the tokenizer's absolute path, so each clone's data/tokenized got its own hash
        files = [{p.relative_to(r): p.read_bytes() for p in (r / "data" / name).rglob("*")
                  if p.is_file()} for r in (uninterrupted, again)]
        assert files[0] == files[1], name
    for name in ("source.model", "target.model", "tokenizer.json"):
        assert (uninterrupted / "models/tokenizer" / name).read_bytes() == (
            again / "models/tokenizer" / name).read_bytes()
    expected, got = weights(uninterrupted), weights(again)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_tokenized_data_from_another_tokenizer_is_refused(tokenized_root, tmp_path):
    """tokenize replaces models/tokenizer, then data/tokenized: a kill in between used to pair
    new ids with an old vocabulary, silently."""
    import json

    root = fresh_copy(tokenized_root, tmp_path / "r")
    meta = root / "models/tokenizer/tokenizer.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "note": "another run"}))
    assert_one_line_error(run_stage(root, "train"), "was not encoded with the tokenizer")


def test_augmented_training_takes_more_pairs_and_resumes_bitwise(tokenized_root, uninterrupted,
                                                                  tmp_path):
    """Joined pairs and re-sampled subwords (drawn from seed and epoch) lengthen each epoch,
    change what is learnt, and a killed run (target word dropout on too) still resumes to the
    same weights."""
    def augmented(name: str):
        root = fresh_copy(tokenized_root, tmp_path / name)
        params = (root / "params.yaml").read_text()
        params = params.replace("concat_ratio: 0.0", "concat_ratio: 0.5")
        params = params.replace("target_word_dropout: 0.0", "target_word_dropout: 0.1")
        (root / "params.yaml").write_text(params.replace("subword_alpha: 0.0",
                                                         "subword_alpha: 0.2"))
        return root

    clean = augmented("clean")
    assert train(clean).returncode == 0
    assert steps_per_epoch(clean) > 1.3 * steps_per_epoch(uninterrupted)
    assert not torch.equal(weights(clean)["generator.weight"],
                           weights(uninterrupted)["generator.weight"])
    killed = augmented("killed")
    assert train(killed, "after_periodic_save:3").returncode == 137
    resumed = train(killed)
    assert resumed.returncode == 0, resumed.stderr
    expected, got = weights(clean), weights(killed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
