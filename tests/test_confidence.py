"""The confidence curve and the measures of how well it ranks bad translations
(src/runtime/confidence.py), on numbers whose answers are known."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from src.runtime import confidence


def test_fit_recovers_a_known_logistic_curve():
    rng = random.Random(0)
    features = [rng.uniform(-3.0, 0.0) for _ in range(20_000)]
    good = [rng.random() < 1 / (1 + math.exp(-(2.0 * x + 3.0))) for x in features]
    fitted = confidence.fit(features, good)
    assert fitted.slope == pytest.approx(2.0, abs=0.15)
    assert fitted.intercept == pytest.approx(3.0, abs=0.2)
    assert fitted.sentences == 20_000
    assert fitted(-1.5) == pytest.approx(0.5, abs=0.03)


def test_a_constant_outcome_gives_a_flat_curve_at_its_rate():
    fitted = confidence.fit([-1.0, -2.0, -0.5], [True, True, True])
    assert fitted.slope == 0.0 and fitted(-10.0) == fitted(0.0) > 0.99


def test_the_curve_survives_the_metadata_round_trip():
    fitted = confidence.Calibration(1.5, 2.25, 30.0, 1000)
    assert confidence.from_metadata({"confidence": fitted.to_metadata()}) == fitted
    assert confidence.from_metadata({}) is None


def test_without_a_curve_the_confidence_is_the_geometric_mean_token_probability():
    assert confidence.confidence(math.log(0.5), None) == pytest.approx(0.5)
    assert confidence.confidence(None, None) is None
    assert confidence.confidence(float("-inf"), None) == 0.0


def test_the_feature_undoes_the_length_penalty():
    # 4 tokens of log p -1 each: score -4 / 4**0.6
    assert confidence.mean_logp(-4 / 4 ** 0.6, 4, 0.6) == pytest.approx(-1.0)
    assert confidence.mean_logp(-1.25, None, 1.0) == -1.25
    assert confidence.mean_logp(-1.25, None, 0.6) is None


def brute_force_auroc(scores, positive):
    pos = [s for s, y in zip(scores, positive) if y]
    neg = [s for s, y in zip(scores, positive) if not y]
    pairs = list(itertools.product(pos, neg))
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def test_auroc_is_the_share_of_correctly_ordered_pairs_ties_half():
    rng = random.Random(1)
    scores = [rng.choice([0.1, 0.2, 0.3, 0.4]) for _ in range(60)]
    positive = [rng.random() < 0.4 for _ in range(60)]
    assert confidence.auroc(scores, positive) == pytest.approx(brute_force_auroc(scores,
                                                                                 positive))
    assert confidence.auroc([1.0, 2.0], [True, True]) is None


def test_review_catch_and_risk_coverage_on_a_perfect_and_a_useless_ranking():
    quality = list(range(100))  # sentence chrF 0..99
    assert confidence.review_catch(quality, quality) == 1.0  # confidence = quality
    assert confidence.review_catch([-q for q in quality], quality) == 0.0
    curve = confidence.risk_coverage(quality, quality, points=4)
    assert [row["coverage"] for row in curve] == [0.25, 0.5, 0.75, 1.0]
    assert [row["mean_chrf"] for row in curve] == [87.0, 74.5, 62.0, 49.5]
