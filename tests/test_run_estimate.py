"""The run's estimate: durations as the log writes them, the steps and validations left (epochs
in both directions, budgets), the seconds they take at the measured pace, and its lines."""

from __future__ import annotations

import pytest
from helpers import train_cfg

from src.training.epochs import RunClock
from src.training.estimate import (
    Budget,
    Pace,
    RunEstimate,
    WorkLeft,
    budget,
    duration,
    epoch_steps_left,
    per_item,
    work_left,
)
from src.training.resume import TrainState


@pytest.mark.parametrize("seconds, text", [
    (-5.0, "0 s"), (0.0, "0 s"), (44.4, "44 s"), (44.5, "45 s"), (59.4, "59 s"),
    (59.6, "1 min 00 s"), (125.0, "2 min 05 s"), (140.0, "2 min 20 s"), (599.4, "9 min 59 s"),
    (599.6, "10 min"), (629.0, "10 min"), (630.0, "11 min"), (3569.0, "59 min"),
    (3570.0, "1 h 00 min"), (13_260.0, "3 h 41 min"), (100_000.0, "27 h 47 min")])
def test_a_duration_is_rounded_to_its_last_unit(seconds, text):
    assert duration(seconds) == text


def test_a_time_per_item_keeps_three_digits_under_a_minute():
    assert [per_item(s) for s in (0.79, 0.0123, 3.944, 59.94, 59.96, 245.3)] == [
        "0.79 s", "0.0123 s", "3.94 s", "59.9 s", "1 min 00 s", "4 min 05 s"]


def test_the_budget_that_binds_first_is_named_in_steps():
    assert budget(1_200, 600.0, 0, 0, 0.8) is None
    assert budget(1_200, 600.0, 5_000, 0, 0.8) == Budget(3_800, "train.max_steps 5,000")
    # 6,600 s left of 120 min at 0.8 s a step; one second less still starts step 8,249
    assert budget(1_200, 600.0, 0, 120, 0.8) == Budget(8_250, "train.max_minutes 120")
    assert budget(1_200, 601.0, 0, 120, 0.8) == Budget(8_249, "train.max_minutes 120")
    assert budget(1_200, 600.0, 9_000, 120, 0.8) == Budget(7_800, "train.max_steps 9,000")
    assert budget(1_200, 600.0, 50_000, 120, 0.8) == Budget(8_250, "train.max_minutes 120")
    assert budget(1_200, 40.0, 0, 0.5, 0.5) == Budget(0, "train.max_minutes 0.5")  # spent


def test_epochs_in_both_directions_are_counted_at_their_own_length():
    assert epoch_steps_left(0, 450, 4, 2, 500, 240) == [450, 500, 240, 240]
    assert epoch_steps_left(1, 30, 4, 2, 500, 240) == [30, 240, 240]
    assert epoch_steps_left(2, 30, 4, 0, 500, 240) == [30, 240]
    assert epoch_steps_left(3, 7, 4, 9, 500, 240) == [7]


def test_the_work_left_stops_where_a_budget_ends_the_run():
    epochs = [450, 500, 240, 240]
    assert work_left(epochs, None) == WorkLeft(1_430, 4, 450)
    assert work_left(epochs, Budget(5_000, "b")) == WorkLeft(1_430, 4, 450)
    assert work_left(epochs, Budget(1_430, "b")) == WorkLeft(1_430, 4, 450)  # at the end
    # cut inside epoch 3, which is validated; epoch 4 never begins
    assert work_left(epochs, Budget(1_000, "b")) == WorkLeft(1_000, 3, 450, "b")
    # spent at the end of epoch 2: epoch 3 never begins
    assert work_left(epochs, Budget(950, "b")) == WorkLeft(950, 2, 450, "b")
    assert work_left(epochs, Budget(200, "b")) == WorkLeft(200, 1, 200, "b")
    assert work_left(epochs, Budget(0, "b")) == WorkLeft(0, 1, 0, "b")  # still validated


# 50 steps in 39.5 s over 130,000 tokens: 0.79 s a step, 3,291 tok/s
FIRST_STEPS = Pace(50, 39.5, 130_000)


def test_before_any_validation_is_timed_the_estimate_holds_the_steps_and_says_so():
    work = WorkLeft(17_130, 64, 450)
    estimate = RunEstimate(work, FIRST_STEPS, first_epoch=1)
    assert estimate.validations == 65  # each epoch's and the averaged model's
    assert estimate.seconds == pytest.approx(13_532.7)  # 17,130 x 0.79
    assert estimate.eta() == "3 h 46 min + validations"
    assert estimate.epoch_eta() == "5 min 56 s"  # 450 x 0.79 = 355.5 s
    assert estimate.line(both_ways=7) == (
        "train: run estimate: 3 h 46 min + validations left for epochs 1-64 (1-7 both ways): "
        "17,130 steps at 0.79 s/step (3,291 tok/s, measured over 50 steps) + 65 validations, "
        "not timed yet (an updated estimate follows the first)")


def test_timed_validations_join_the_estimate():
    pace = Pace(500, 400.0, 1_250_000, epoch_ends=1, epoch_end_seconds=12.25)  # 0.8 s a step
    estimate = RunEstimate(WorkLeft(16_000, 63, 500), pace, first_epoch=2)
    assert estimate.validation_seconds == 64 * 12.25
    assert estimate.seconds == 16_000 * 0.8 + 64 * 12.25  # 13,584 s
    assert estimate.eta() == "3 h 46 min"
    assert estimate.line(both_ways=7, patience=5) == (
        "train: run estimate: 3 h 46 min left for epochs 2-64 (2-7 both ways): 16,000 steps "
        "at 0.8 s/step (3,125 tok/s, measured over 500 steps) + 64 validations at 12.2 s each "
        "as timed so far (each epoch's with its saves, and the averaged model's); "
        "train.patience 5 may stop it sooner")


def test_the_line_names_a_budget_that_ends_the_run_and_single_epochs():
    pace = Pace(100, 50.0, 100_000, epoch_ends=2, epoch_end_seconds=3.0)  # 0.5 s a step
    cut = RunEstimate(WorkLeft(3_800, 12, 200, "train.max_steps 5,000"), pace, first_epoch=9)
    assert cut.line(both_ways=0) == (
        "train: run estimate: 32 min left for epochs 9-20, where train.max_steps 5,000 ends the "
        "run: 3,800 steps at 0.5 s/step (2,000 tok/s, measured over 100 steps) + 13 "
        "validations at 1.5 s each as timed so far (each epoch's with its saves, and the "
        "averaged model's)")
    last = RunEstimate(WorkLeft(30, 1, 30), pace, first_epoch=7)
    assert last.seconds == 30 * 0.5 + 2 * 1.5
    assert last.line(both_ways=7).startswith(
        "train: run estimate: 18 s left for epoch 7 (both ways): 30 steps at 0.5 s/step")
    last_both_ways = RunEstimate(WorkLeft(30 + 240, 2, 30), pace, first_epoch=7)
    assert last_both_ways.line(both_ways=7).startswith(
        "train: run estimate: 2 min 20 s left for epochs 7-8 (epoch 7 both ways): 270 steps")
    assert "both ways" not in RunEstimate(WorkLeft(30, 1, 30), pace, 8).line(both_ways=7)
    one_step = RunEstimate(WorkLeft(30, 1, 30), Pace(1, 0.5, 1_000), 8).line(both_ways=0)
    assert "(2,000 tok/s, measured over 1 step) + 2 validations, not timed yet" in one_step


def test_the_epoch_eta_never_passes_the_runs():
    """The epoch's ETA and the run's come from one pace; a budget inside the epoch in
    progress shortens both."""
    pace = Pace(10, 10.0, 10_000, epoch_ends=1, epoch_end_seconds=0.0)
    estimate = RunEstimate(WorkLeft(200, 1, 200, "train.max_steps 1,000"), pace, 1)
    assert (estimate.epoch_eta(), estimate.eta()) == ("3 min 20 s", "3 min 20 s")


def test_the_clock_measures_this_process_and_counts_whole_steps_left():
    """A run resumed at step 40 (30 s, 90,000 tokens in): the pace is this process's steps
    only, and with accumulation 2 the 899 batches left in the epoch are 450 steps."""
    cfg = train_cfg(epochs=4, bidirectional_epochs=2, accumulation_steps=2)
    st = TrainState(step=40, epoch=0, batch_in_epoch=80, train_seconds=30.0, tokens_seen=90_000)
    clock = RunClock.at(st)
    st.step, st.batch_in_epoch, st.train_seconds, st.tokens_seen = 50, 100, 38.0, 110_000
    clock.epoch_ends.append(4.0)
    estimate = clock.estimate(cfg, st, usable=999, span=2, epoch_lengths=(500, 240))
    assert estimate.pace == Pace(10, 8.0, 20_000, 1, 4.0)
    assert estimate.work == WorkLeft(450 + 500 + 240 + 240, 4, 450)
    assert estimate.first_epoch == 1
    capped = clock.estimate(cfg.model_copy(update={"max_steps": 1_050}), st, 999, 2,
                            (500, 240))
    assert capped.work == WorkLeft(1_000, 3, 450, "train.max_steps 1,050")
