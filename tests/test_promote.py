"""src.promote's rule: the champion moves only to another version, strictly better on the new
test split and at most a margin worse on each old test set, and a version without the metric is
refused rather than compared. The registry round trip (aliases on a real
MLflow store) is tests/test_serving.py::test_promote_moves_champion_to_a_better_candidate_only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from src.core.errors import PipelineError
from src.promote import score, should_promote, version_by_alias


@pytest.mark.parametrize("candidate, champion, new, old, promoted", [
    ("2", None, 10.0, None, True),      # no champion yet: any candidate
    ("2", "1", 30.5, 30.0, True),       # better than the champion
    ("2", "1", 30.0, 30.0, False),      # a tie keeps the champion
    ("2", "1", 29.0, 30.0, False),      # worse
    ("1", "1", 99.0, 30.0, False),      # the champion itself
])
def test_the_champion_moves_only_to_another_strictly_better_version(candidate, champion, new,
                                                                    old, promoted):
    assert should_promote(candidate, champion, new, old)[0] is promoted


@pytest.mark.parametrize("sets, promoted, said", [
    ({}, True, "rule 2 held (no old test set in common)"),
    ({"old": (35.6, 36.0)}, True, "rule 2 held (old 35.60 vs 36.00, margin 0.5)"),
    ({"old": (35.5, 36.0)}, True, "rule 2 held"),  # exactly the margin: allowed
    ({"old": (35.4, 36.0), "other": (40.0, 30.0)}, False,
     "rule 2 (at most 0.5 BLEU below the champion on each old test set) failed on old: "
     "35.40 vs 36.00"),
])
def test_a_better_candidate_that_forgot_an_old_set_beyond_the_margin_is_kept_out(sets, promoted,
                                                                                 said):
    decided, why = should_promote("2", "1", 31.0, 30.0, sets, margin=0.5)
    assert decided is promoted and said in why


def test_rule_one_decides_first_and_says_so():
    decided, why = should_promote("2", "1", 29.0, 30.0, {"old": (50.0, 30.0)})
    assert not decided
    assert why == "rule 1 (better on the new test split) failed: fp32_bleu 29.00 vs the " \
                  "champion's 30.00"


def client_with(metrics: dict, run_id: str = "abc") -> SimpleNamespace:
    """A registry client whose one run, `run_id`, logged `metrics`."""
    runs = {run_id: SimpleNamespace(data=SimpleNamespace(metrics=metrics))}
    return SimpleNamespace(get_run=lambda asked: runs[asked])


def test_a_version_is_scored_by_its_run_metric():
    version = SimpleNamespace(version="3", run_id="abc")
    assert score(client_with({"fp32_bleu": 31.25}), version, "fp32_bleu") == 31.25


@pytest.mark.parametrize("run_id, metrics", [("abc", {"other": 1.0}), ("", {"fp32_bleu": 5.0})])
def test_a_version_without_the_metric_is_refused_not_compared(run_id, metrics):
    version = SimpleNamespace(version="3", run_id=run_id)
    with pytest.raises(PipelineError, match="version 3 has no metric 'fp32_bleu'"):
        score(client_with(metrics), version, "fp32_bleu")


def test_an_alias_nobody_holds_is_none_and_a_held_one_is_its_version():
    from mlflow.exceptions import MlflowException

    held = SimpleNamespace(version="4")

    def by_alias(name, alias):
        if (name, alias) == ("nmt-en-zh", "champion"):
            return held
        raise MlflowException(f"alias {alias} not found")

    client = SimpleNamespace(get_model_version_by_alias=by_alias)
    assert version_by_alias(client, "nmt-en-zh", "champion") is held
    assert version_by_alias(client, "nmt-en-zh", "candidate") is None
