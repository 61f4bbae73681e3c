"""train.bidirectional_epochs: the first epochs also train on the reversed pairs, the cosine
schedule still reaches zero at the end of the last epoch, and the run's estimate counts the
longer epochs."""

from __future__ import annotations

import csv
import re

import pytest
from helpers import TINY_PARAMS, run_stage, tokenize_toy

LR = 0.001


@pytest.mark.slow  # trains
def test_bidirectional_epochs_are_twice_as_long_and_the_cosine_horizon_counts_them(tmp_path):
    root = tokenize_toy(tmp_path, **{**TINY_PARAMS, "train": {
        "epochs": 3, "max_steps": 0, "max_tokens": 400, "warmup_steps": 0, "lr": LR,
        "schedule": "cosine", "concat_ratio": 0.0, "subword_alpha": 0.0, "patience": 0,
        "bidirectional_epochs": 1, "log_every_steps": 5, "threads": 1, "average_best": 1}})
    result = run_stage(root, "train")
    assert result.returncode == 0, result.stderr
    with (root / "models/valid_curve.csv").open() as fh:
        ends = [int(row["step"]) for row in csv.DictReader(fh)]
    both_ways, plain = ends[0], ends[1] - ends[0]
    assert ends[2] - ends[1] == plain
    assert 1.6 * plain <= both_ways <= 2.4 * plain  # every pair twice, batched by length
    # the start-up line names both lengths (it said ~plain for every epoch before)
    said = re.search(r"~(\d+) steps/epoch in both directions for the first 1, then ~(\d+) "
                     r"steps/epoch", result.stdout)
    assert said, result.stdout
    assert abs(int(said[1]) - both_ways) <= 1 and abs(int(said[2]) - plain) <= 1
    with (root / "models/train_curve.csv").open() as fh:
        last = list(csv.DictReader(fh))[-1]
    # horizon = 2 x plain + 2 x plain steps; counting epoch 1's length three times would
    # leave the last step at about 3/4 of the cosine, lr ~0.15 x LR
    assert int(last["step"]) == ends[2] and float(last["lr"]) < 0.03 * LR
    assert_the_log_estimates_the_run(result.stdout, ends)


def assert_the_log_estimates_the_run(log: str, ends: list[int]) -> None:
    """After the first 5 steps (train.log_every_steps) one line estimates the whole run, epoch 1
    in both directions counted at its length, validation not timed yet; once epoch 1's is, the
    estimate is said again with it; every progress line has the run's ETA beside the epoch's.
    The later epochs' steps are counted at start-up on another shuffle: a step either way
    each."""
    lines = log.splitlines()
    estimates = [i for i, line in enumerate(lines) if line.startswith("train: run estimate: ")]
    progress = [i for i, line in enumerate(lines) if line.startswith("train: step ")]
    assert len(estimates) == 2 and len(progress) == ends[2] // 5, log
    first, second = (lines[i] for i in estimates)
    assert estimates[0] == progress[0] - 1 and lines[progress[0]].startswith("train: step 5,")
    said = re.fullmatch(r"train: run estimate: \d.* \+ validations left for epochs 1-3 \(epoch 1 "
                        r"both ways\): (\d+) steps at [\d.]+ s/step \([\d,]+ tok/s, measured "
                        r"over 5 steps\) \+ 4 validations, not timed yet .*", first)
    assert said and abs(int(said[1]) - (ends[2] - 5)) <= 2, first
    assert lines[estimates[1] - 1].startswith("epoch 1: ")
    said = re.fullmatch(r"train: run estimate: \d[^+]* left for epochs 2-3: (\d+) steps at .* "
                        r"\+ 3 validations at [\d.]+ s each as timed so far .*", second)
    assert said and abs(int(said[1]) - (ends[2] - ends[0])) <= 1, second
    eta = re.compile(r"train: step .*, epoch ETA \d[\d a-z]*, run ETA \d[\d a-z]*"
                     r"( \+ validations)?")
    assert all(eta.fullmatch(lines[i]) for i in progress), log
    # validation is in the run's ETA from the line that says it was timed
    assert [bool(eta.fullmatch(lines[i])[1]) for i in progress] == [
        i < estimates[1] for i in progress]
