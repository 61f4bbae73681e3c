"""train.bidirectional_epochs: the first epochs also train on the reversed pairs, and the
cosine schedule still reaches zero at the end of the last epoch."""

from __future__ import annotations

import csv
import re

from helpers import TINY_PARAMS, run_stage, tokenize_toy

LR = 0.001


def test_bidirectional_epochs_are_twice_as_long_and_the_cosine_horizon_counts_them(tmp_path):
    root = tokenize_toy(tmp_path, **{**TINY_PARAMS, "train": {
        "epochs": 3, "max_steps": 0, "max_tokens": 400, "warmup_steps": 0, "lr": LR,
        "schedule": "cosine", "concat_ratio": 0.0, "subword_alpha": 0.0, "patience": 0,
        "bidirectional_epochs": 1, "log_every_steps": 1, "threads": 1, "average_best": 1}})
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
