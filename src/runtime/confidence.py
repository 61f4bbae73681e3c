"""A per-sentence confidence in [0, 1] from the search's score, the same number in every runtime.

The feature is the translation's mean log-probability per token (its score with length
penalty 1: sum(log p) / length, length its tokens + 1: the EOS, or the limit it was cut at).
Export fits a logistic curve on the valid split, P(sentence chrF >= threshold) =
sigmoid(slope * mean_logp + intercept), and stores it in each file's metadata (`confidence`,
JSON); `src.infer`, the MLflow model and any other client read it from there. A file without
it gets the uncalibrated exp(mean_logp), the geometric mean of the token probabilities. Both
only ever rise with mean_logp, so the ranking (what the evaluate stage's AUROC and
risk-coverage curve measure) is the feature's.

numpy only: this runs where the model runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

METADATA_KEY = "confidence"
# "A bad translation", the event the confidence predicts the absence of: sentence chrF below
# this (on the 0-100 scale). Chosen once, for the default corpus's short sentences.
CHRF_THRESHOLD = 30.0
# numpy's stable sort: equal values keep their input order (numpy reads the name in any case)
STABLE = "stable"  # pragma: no mutate


def mean_logp(score: float, tokens: int | None, length_penalty: float) -> float | None:
    """The mean log-probability per token behind a score sum(log p) / tokens**length_penalty;
    None when the length is unknown and the penalty is not 1."""
    if length_penalty == 1.0:
        return score
    if not tokens:
        return None
    return score * tokens ** length_penalty / tokens


@dataclass(frozen=True)
class Calibration:
    slope: float
    intercept: float
    chrf_threshold: float
    sentences: int  # how many valid sentences it was fitted on

    def __call__(self, feature: float) -> float:
        return _sigmoid(self.slope * feature + self.intercept)

    def to_metadata(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _floats(values) -> np.ndarray:
    """`values` as float64, however the caller gives them (numpy would infer float64 from
    floats, and the Newton step and the sums turn booleans into floats): its mutants cannot
    show."""
    return np.asarray(values, dtype=np.float64)  # pragma: no mutate


def _sigmoid(x: float) -> float:
    # Both forms are the sigmoid; each side uses the one whose exp cannot overflow, so where
    # the switch sits (0, or a mutant's 1) changes nothing.
    if x >= 0:  # pragma: no mutate
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(x) / (1.0 + math.exp(x))


def from_metadata(meta: Mapping[str, str]) -> Calibration | None:
    text = meta.get(METADATA_KEY)
    return Calibration(**json.loads(text)) if text else None


def confidence(feature: float | None, calibration: Calibration | None) -> float | None:
    """The confidence of a translation with mean log-probability `feature`."""
    if feature is None or not math.isfinite(feature):
        return None if feature is None else 0.0
    return calibration(feature) if calibration else math.exp(feature)


def fit(features: Sequence[float], good: Sequence[bool], chrf_threshold: float = CHRF_THRESHOLD,
        l2: float = 1e-3,
        steps: int = 50,  # pragma: no mutate (a cap: fits converge in 6-10 Newton steps)
        ) -> Calibration:
    """Logistic regression of `good` on `features` (one feature: Newton's method on the
    L2-regularised log-likelihood, which converges in a few steps); a constant outcome gives
    a flat curve at its rate."""
    x, y = _floats(features), _floats(good)
    keep = np.isfinite(x)
    x, y = x[keep], y[keep]
    if len(x) == 0 or y.min() == y.max():
        rate = float(y.mean()) if len(y) else 0.5
        rate = min(max(rate, 1e-6), 1 - 1e-6)
        return Calibration(0.0, math.log(rate / (1 - rate)), chrf_threshold, int(len(x)))
    design = np.stack([x, np.ones_like(x)], axis=1)
    weights = np.zeros(2)
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(design @ weights)))
        gradient = design.T @ (p - y) + l2 * weights
        hessian = (design.T * (p * (1 - p))) @ design + l2 * np.eye(2)
        delta = np.linalg.solve(hessian, gradient)
        weights -= delta
        if np.abs(delta).max() < 1e-9:  # pragma: no mutate (< or <=: the same stop)
            break
    return Calibration(float(weights[0]), float(weights[1]), chrf_threshold, int(len(x)))


def auroc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """Area under the ROC curve of `scores` ranking the `positive` cases first (ties count
    half: the Mann-Whitney U statistic); None without both kinds of case."""
    s = _floats(scores)
    pos = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return None
    # each value's rank, 1-based, averaged over equal values
    _, group, counts = np.unique(s, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # the rank of each group's last member
    ranks = (last - (counts - 1) / 2)[group]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def risk_coverage(confidences: Sequence[float], quality: Sequence[float],
                  points: int = 20) -> list[dict[str, float]]:
    """Keeping the most confident translations: at each coverage (share kept, 1/points steps),
    the mean quality (sentence chrF) of those kept."""
    c, q = _floats(confidences), _floats(quality)
    order = np.argsort(-c, kind=STABLE)  # equal confidences keep their order
    rows = []
    for k in range(1, points + 1):
        kept = max(1, round(len(c) * k / points))
        rows.append({"coverage": round(k / points, 4),
                     "mean_chrf": round(float(q[order[:kept]].mean()), 3)})
    return rows


def review_catch(confidences: Sequence[float], quality: Sequence[float],
                 share: float = 0.1) -> float:
    """Sending the least confident `share` of translations to review: the part of the worst
    `share` (by quality) that this catches (1.0: all of them; `share`: no better than chance)."""
    c, q = _floats(confidences), _floats(quality)
    k = max(1, round(len(c) * share))
    reviewed = set(np.argsort(c, kind=STABLE)[:k].tolist())  # ties: the earlier first
    worst = set(np.argsort(q, kind=STABLE)[:k].tolist())
    return len(reviewed & worst) / k
