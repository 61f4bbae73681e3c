"""How many times each training pair is taken at its corpus's weight: fixed in the data by
the split stage (`copies`), or drawn afresh each epoch by the train stage for a corpus marked
`per_epoch` (`epoch_copies`). One rule for both, so a weight means the same wherever it is
applied (src/data/mixing.py)."""

from __future__ import annotations

import math
import random

import numpy as np


def copies(n_train: int, weight: float, rng: random.Random) -> np.ndarray:
    """How many times each of a corpus's `n_train` training pairs is taken at `weight`."""
    whole, fraction = math.floor(weight), weight - math.floor(weight)
    times = np.full(n_train, whole, np.int64)  # pragma: no mutate (int64 is the default)
    times[rng.sample(range(n_train), round(fraction * n_train))] += 1
    return times


def epoch_copies(drawn_weight: np.ndarray, seed: tuple) -> np.ndarray:
    """How many times each training pair is taken in one epoch: once where `drawn_weight` is 0
    (weighted in the data already), and `copies` of each per-epoch corpus's rows (those that
    share a weight) at that weight, drawn from `seed` (the run's seed and the epoch)."""
    times = np.ones(len(drawn_weight), np.int64)
    for weight in np.unique(drawn_weight[drawn_weight > 0]):
        rows = np.flatnonzero(drawn_weight == weight)
        times[rows] = copies(len(rows), float(weight), random.Random(str(seed + (weight,))))
    return times


def epoch_rows(drawn_weight: np.ndarray, seed: tuple) -> np.ndarray:
    """The row indices one epoch takes, in order, each as often as `epoch_copies` says."""
    times = epoch_copies(drawn_weight, seed)
    return np.repeat(np.arange(len(times)), times)
