"""How many times a training pair is taken at its corpus's weight (src/data/corpus_weights.py):
fixed in the data by split, or drawn afresh each epoch by train for a `per_epoch` corpus."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from src.data.corpus_weights import copies, epoch_copies


@pytest.mark.parametrize("weight, n, whole, extra", [
    (1.0, 10, 1, 0), (2.0, 10, 2, 0), (0.5, 10, 0, 5), (2.25, 8, 2, 2), (0.0, 7, 0, 0),
    (1.5, 3, 1, 2),  # round(1.5) = 2: Python rounds half to even
])
def test_copies_take_the_whole_part_for_every_pair_and_the_fraction_for_a_seeded_sample(
        weight, n, whole, extra):
    times = copies(n, weight, random.Random(1))
    assert times.dtype == np.int64 and len(times) == n
    assert Counter(times.tolist()) == Counter({whole: n - extra, whole + 1: extra} if extra
                                              else {whole: n})


def test_copies_sample_depends_on_the_seed_only():
    a = copies(100, 0.3, random.Random("0/news"))
    assert (a == copies(100, 0.3, random.Random("0/news"))).all()
    assert (a != copies(100, 0.3, random.Random("0/web"))).any()
    assert copies(0, 0.5, random.Random(0)).tolist() == []


# rows 0-9 weighted in the data, 10-109 a corpus at 0.1 per epoch, 110-129 one at 1.5
DRAWN = np.concatenate([np.zeros(10), np.full(100, 0.1), np.full(20, 1.5)]).astype(np.float32)


def test_each_epoch_takes_every_fixed_row_once_and_each_drawn_corpus_at_its_weight():
    times = epoch_copies(DRAWN, (0, 3))
    assert times[:10].tolist() == [1] * 10
    assert Counter(times[10:110].tolist()) == {0: 90, 1: 10}
    assert Counter(times[110:].tolist()) == {1: 10, 2: 10}


def test_the_draw_is_the_seed_and_epochs_own():
    epochs = [epoch_copies(DRAWN, (0, epoch)) for epoch in range(4)]
    assert (epochs[2] == epoch_copies(DRAWN, (0, 2))).all()  # a resumed run draws the same
    drawn = [frozenset(np.flatnonzero(times[10:110])) for times in epochs]
    assert len(set(drawn)) == 4  # a new tenth each epoch
    assert (epoch_copies(DRAWN, (1, 2)) != epochs[2]).any()
    assert len(frozenset().union(*(frozenset(np.flatnonzero(epoch_copies(DRAWN, (0, e))[10:110]))
                                   for e in range(40)))) > 90  # most rows over 40 epochs
