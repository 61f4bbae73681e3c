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


def test_the_sigmoid_is_exact_and_never_overflows_on_either_side():
    curve = confidence.Calibration(1.0, 0.0, 30.0, 10)
    assert curve(0.0) == 0.5
    assert curve(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)), rel=1e-12)
    assert curve(-2.0) == pytest.approx(1 / (1 + math.exp(2.0)), rel=1e-12)
    assert curve(-800.0) == 0.0 and curve(800.0) == 1.0  # exp(800) would overflow
    assert confidence.Calibration(2.0, -1.0, 30.0, 10)(1.5) == pytest.approx(
        1 / (1 + math.exp(-2.0)), rel=1e-12)
    assert confidence.confidence(-1.0, curve) == pytest.approx(1 / (1 + math.e), rel=1e-12)


def test_fit_leaves_out_non_finite_features_and_counts_only_the_rest():
    rng = random.Random(4)
    features = [rng.uniform(-3.0, 0.0) for _ in range(2_000)]
    good = [rng.random() < 1 / (1 + math.exp(-(2.0 * x + 3.0))) for x in features]
    clean = confidence.fit(features, good)
    noisy = confidence.fit(features + [float("-inf"), float("nan")] * 5, good + [False] * 10)
    assert noisy == clean and noisy.sentences == 2_000


def test_a_constant_or_empty_outcome_gives_a_clamped_flat_curve():
    never = confidence.fit([-1.0, -2.0], [False, False])
    assert never.slope == 0.0 and never(0.0) == pytest.approx(1e-6)
    empty = confidence.fit([], [])
    assert empty.slope == 0.0 and empty.intercept == 0.0 and empty.sentences == 0
    only_inf = confidence.fit([float("-inf")], [True])
    assert only_inf.sentences == 0 and only_inf(0.0) == 0.5
    half = confidence.fit([-1.0, -1.0, -1.0, -1.0], [True, False, True, False])
    assert half.slope == pytest.approx(0.0, abs=1e-6) and half(-1.0) == pytest.approx(0.5)
    assert confidence.fit([-1.0], [True], chrf_threshold=45.0).chrf_threshold == 45.0


def test_fit_stops_at_the_optimum_of_the_regularised_likelihood():
    # separable data: the L2 term keeps the weights finite, and the result is its optimum
    features = [-2.0, -1.5, -0.5, -0.2]
    good = [False, False, True, True]
    fitted = confidence.fit(features, good, l2=1e-3)
    w = [fitted.slope, fitted.intercept]
    p = [1 / (1 + math.exp(-(w[0] * x + w[1]))) for x in features]
    grad = [sum((pi - yi) * x for pi, yi, x in zip(p, good, features)) + 1e-3 * w[0],
            sum(pi - yi for pi, yi in zip(p, good)) + 1e-3 * w[1]]
    assert max(abs(g) for g in grad) < 1e-6
    assert fitted(-0.5) > 0.9 and fitted(-1.5) < 0.1
    stronger = confidence.fit(features, good, l2=1.0)
    assert abs(stronger.slope) < abs(fitted.slope)  # more regularisation, a flatter curve
    one_step = confidence.fit(features, good, l2=1e-3, steps=1)
    assert one_step.slope != fitted.slope  # not converged after one Newton step


def test_auroc_of_perfect_reversed_and_tied_rankings():
    assert confidence.auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert confidence.auroc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert confidence.auroc([0.5, 0.5, 0.5], [True, False, True]) == 0.5
    assert confidence.auroc([0.3, 0.3, 0.1, 0.9], [True, False, False, True]) == 0.875
    assert confidence.auroc([], []) is None and confidence.auroc([1.0], [False]) is None


def test_risk_coverage_keeps_at_least_one_and_rounds_the_share_kept():
    curve = confidence.risk_coverage([0.9, 0.1, 0.5], [10.0, 70.0, 40.0], points=4)
    # kept: max(1, round(3 x 1/4)) = 1, round(1.5) = 2, round(2.25) = 2, 3
    assert [row["mean_chrf"] for row in curve] == [10.0, 25.0, 25.0, 40.0]
    assert curve[0]["coverage"] == 0.25 and len(confidence.risk_coverage([1.0], [5.0])) == 20
    # equal confidences keep their input order
    tied = confidence.risk_coverage([0.5, 0.5, 0.5], [1.0, 2.0, 3.0], points=3)
    assert [row["mean_chrf"] for row in tied] == [1.0, 1.5, 2.0]
    assert confidence.risk_coverage([0.3], [1 / 3], points=1)[0]["mean_chrf"] == 0.333
    assert confidence.risk_coverage([0.3] * 3, [0.0] * 3, points=3)[0]["coverage"] == 0.3333


def test_review_catch_reviews_at_least_one_and_the_share_rounded():
    assert confidence.review_catch([0.1, 0.9], [5.0, 50.0], share=0.1) == 1.0  # k = 1
    assert confidence.review_catch([0.9, 0.1], [5.0, 50.0], share=0.1) == 0.0
    # 10 sentences, share 0.25 -> k = round(2.5) = 2: the two least confident are reviewed
    conf = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    quality = [1.0, 90.0, 2.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 20.0]
    assert confidence.review_catch(conf, quality, share=0.25) == 0.5
    assert confidence.review_catch(conf, quality, share=0.3) == pytest.approx(2 / 3)
    assert confidence.review_catch(conf, quality) == 1.0  # default share 0.1: k = 1


def test_the_curve_is_stored_as_sorted_json_so_equal_curves_give_equal_files():
    fitted = confidence.Calibration(1.5, 2.25, 30.0, 1000)
    assert fitted.to_metadata() == (
        '{"chrf_threshold": 30.0, "intercept": 2.25, "sentences": 1000, "slope": 1.5}')


def test_a_fitted_curve_keeps_its_threshold_and_the_default_regularisation():
    features = [-2.0, -1.5, -0.5, -0.2]
    good = [False, False, True, True]
    fitted = confidence.fit(features, good, chrf_threshold=45.0)
    assert fitted.chrf_threshold == 45.0
    assert fitted == confidence.fit(features, good, chrf_threshold=45.0, l2=1e-3)
    assert fitted != confidence.fit(features, good, chrf_threshold=45.0, l2=1.0)


# 40 values of three levels: numpy's default (unstable) sort orders the ties otherwise
TIED = [1, 1, 2, 2, 0, 0, 2, 2, 0, 0, 2, 1, 0, 2, 0, 1, 1, 1, 0, 0, 2, 2, 2, 1, 2, 0, 1, 2, 0, 0,
        0, 1, 2, 0, 1, 1, 2, 0, 1, 0]


def test_equal_confidences_keep_their_order_in_coverage_and_review():
    distinct = [float(i) for i in range(40)]
    # the least confident three of the tied: rows 4, 5, 8 (the first three at level 0)
    worst_are_4_5_8 = [0.0 if i in (4, 5, 8) else 50.0 + i for i in range(40)]
    assert confidence.review_catch(TIED, worst_are_4_5_8, share=3 / 40) == 1.0
    # and the worst three of tied qualities are rows 4, 5, 8 too
    least_confident_4_5_8 = [0.0 if i in (4, 5, 8) else 1.0 + i for i in range(40)]
    assert confidence.review_catch(least_confident_4_5_8, TIED, share=3 / 40) == 1.0
    # the most confident first: the level-2 rows in their order (2, 3, 6, 7, 10, ...)
    kept = confidence.risk_coverage(TIED, distinct, points=40)
    assert [row["mean_chrf"] for row in kept[:5]] == [2.0, 2.5, 3.667, 4.5, 5.6]
