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


# -- rule 2's inputs and the command around the rule -------------------------------------------

def test_old_set_scores_are_the_named_sets_bleu_by_name():
    from src.promote import old_set_scores

    client = client_with({"eval.test_sets.flores.bleu": 30.5, "eval.test_sets.news.bleu": 12,
                          "eval.test_sets.flores.chrf": 55.0, "fp32_bleu": 40.0,
                          "eval.bleu": 41.0})
    assert old_set_scores(client, SimpleNamespace(run_id="abc")) == {"flores": 30.5,
                                                                     "news": 12.0}
    assert old_set_scores(client, SimpleNamespace(run_id="")) == {}


def test_rule_two_names_every_set_it_compared_in_order():
    decided, why = should_promote("2", "1", 31.0, 30.0,
                                  {"news": (20.0, 20.25), "flores": (30.0, 29.0)}, margin=1.5,
                                  metric="bleu")
    assert decided and why == ("rule 1 held (bleu 31.00 vs 30.00) and rule 2 held (flores 30.00 "
                               "vs 29.00, news 20.00 vs 20.25, margin 1.5)")
    decided, why = should_promote("2", "1", 31.0, 30.0, {"b": (1.0, 9.0), "a": (1.0, 9.0)})
    assert not decided and "failed on a: 1.00 vs 9.00" in why
    assert should_promote("2", "1", 31.0, 30.0) == (
        True, "rule 1 held (fp32_bleu 31.00 vs 30.00) and rule 2 held (no old test set in "
              "common)")
    assert should_promote("2", None, 1.0, None) == (True, "no champion yet")
    assert should_promote("3", "3", 1.0, 0.0) == (False, "it is the champion already")


class Registry:
    """A registry of versions (run metrics, parent tags) and aliases, as MlflowClient answers."""

    def __init__(self, versions: dict[str, dict], aliases: dict[str, str]):
        self.versions, self.aliases, self.moved = versions, aliases, []

    def version(self, number: str) -> SimpleNamespace:
        info = self.versions[number]
        return SimpleNamespace(name="nmt-en-zh", version=number, run_id=f"run{number}",
                               tags=info.get("tags", {}))

    def get_model_version_by_alias(self, name, alias):
        from mlflow.exceptions import MlflowException

        if alias not in self.aliases:
            raise MlflowException(f"no alias {alias}")
        return self.version(self.aliases[alias])

    def get_model_version(self, name, number):
        from mlflow.exceptions import MlflowException

        if name not in ("nmt-en-zh", "nmt-zh-en") or number not in self.versions:
            raise MlflowException(f"no version {number}")
        return self.version(number)

    def get_run(self, run_id):
        metrics = self.versions[run_id.removeprefix("run")]["metrics"]
        return SimpleNamespace(data=SimpleNamespace(metrics=metrics))

    def set_registered_model_alias(self, name, alias, number):
        self.moved.append((name, alias, number))


def promote_with(monkeypatch, capsys, registry_client, **options) -> str:
    from src import promote
    from src.core import registry

    monkeypatch.setattr(registry, "open_client", lambda: registry_client)
    defaults = {"name": "nmt-en-zh", "metric": "fp32_bleu", "margin": 0.5, "old_sets": "",
                "dry_run": False}
    promote.main(**(defaults | options))
    return capsys.readouterr().out.strip()


def two_versions(candidate: dict, champion: dict) -> Registry:
    return Registry({"1": {"metrics": champion},
                     "2": {"metrics": candidate, "tags": {"parent_version": "1"}}},
                    {"candidate": "2", "champion": "1"})


def test_the_command_applies_rule_two_to_the_sets_both_versions_have(monkeypatch, capsys):
    client = two_versions(
        {"fp32_bleu": 31.0, "eval.test_sets.flores.bleu": 29.0, "eval.test_sets.news.bleu": 5},
        {"fp32_bleu": 30.0, "eval.test_sets.flores.bleu": 30.0})
    out = promote_with(monkeypatch, capsys, client)
    assert out == ("promote: kept champion version 1; candidate version 2: rule 2 (at most 0.5 "
                   "BLEU below the champion on each old test set) failed on flores: 29.00 vs "
                   "30.00")
    assert client.moved == []
    out = promote_with(monkeypatch, capsys, client, margin=1.0)
    assert out.startswith("promote: version 2 is the champion over version 1: rule 1 held")
    assert client.moved == [("nmt-en-zh", "champion", "2")]


def test_old_sets_named_by_option_must_be_scored_on_both(monkeypatch, capsys):
    client = two_versions(
        {"fp32_bleu": 31.0, "eval.test_sets.flores.bleu": 29.0, "eval.test_sets.news.bleu": 5},
        {"fp32_bleu": 30.0, "eval.test_sets.flores.bleu": 30.0})
    with pytest.raises(PipelineError) as caught:
        promote_with(monkeypatch, capsys, client, old_sets="news, flores")
    assert str(caught.value) == ("old test set 'news' was not scored on both versions "
                                 "(candidate: ['flores', 'news'], champion: ['flores'])")
    out = promote_with(monkeypatch, capsys, client, old_sets=" , ", margin=2.0, dry_run=True)
    assert out.splitlines() == [
        "lineage: version 2 <- version 1",
        "promote: would promote version 2 over version 1: rule 1 held (fp32_bleu 31.00 vs "
        "30.00) and rule 2 held (flores 29.00 vs 30.00, margin 2)"]
    assert client.moved == []


def test_without_a_champion_or_a_candidate(monkeypatch, capsys):
    first = Registry({"1": {"metrics": {"fp32_bleu": 3.0}}}, {"candidate": "1"})
    out = promote_with(monkeypatch, capsys, first, dry_run=True)
    assert out.splitlines() == ["lineage: version 1 was trained from random weights",
                                "promote: would promote version 1: no champion yet"]
    promote_with(monkeypatch, capsys, first)
    assert first.moved == [("nmt-en-zh", "champion", "1")]
    same = Registry({"1": {"metrics": {}}}, {"candidate": "1", "champion": "1"})
    assert promote_with(monkeypatch, capsys, same) == (
        "promote: version 1 is already the champion")
    with pytest.raises(PipelineError, match="no version of nmt-en-zh has the alias 'candidate'"):
        promote_with(monkeypatch, capsys, Registry({}, {}))


def test_the_lineage_names_another_models_parent():
    from src.promote import lineage_line

    client = Registry({"5": {"metrics": {}, "tags": {"parent_version": "2"}},
                       "2": {"metrics": {}}}, {})
    assert lineage_line(client, "nmt-en-zh", "5") == "lineage: version 5 <- version 2"

    class Other(Registry):
        def version(self, number):
            v = super().version(number)
            if number == "9":
                v.name = "nmt-zh-en"
            return v

    crossed = Other({"5": {"metrics": {}, "tags": {"parent_name": "nmt-zh-en",
                                                   "parent_version": "9"}},
                     "9": {"metrics": {}}}, {})
    assert lineage_line(crossed, "nmt-en-zh", "5") == (
        "lineage: version 5 <- nmt-zh-en version 9")


def test_the_default_margin_is_half_a_bleu_point():
    assert should_promote("2", "1", 31.0, 30.0, {"old": (35.5, 36.0)})[0]
    decided, why = should_promote("2", "1", 31.0, 30.0, {"old": (35.4, 36.0)})
    assert not decided and "at most 0.5 BLEU below" in why
