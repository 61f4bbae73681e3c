"""The numpy side of the generation contract (src/runtime/contract.py): the feeds a search
is given and what is read back from its outputs, without a model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from src.runtime import contract
from src.runtime.contract import SCORE_SWITCH


def test_rows_of_one_length_and_of_several_pad_alike():
    same = contract.pad_rows([[5, 6, 3], [7, 8, 3]], pad=0)
    assert same.dtype == np.int32 and same.tolist() == [[5, 6, 3], [7, 8, 3]]
    mixed = contract.pad_rows([[5, 3], [7, 8, 9, 3]], pad=1)
    assert mixed.dtype == np.int32 and mixed.tolist() == [[5, 3, 1, 1], [7, 8, 9, 3]]
    assert contract.pad_rows([[4, 3]], pad=0).shape == (1, 2)


def test_the_shared_search_settings_cannot_be_changed_by_a_caller():
    first = contract.search_feeds(np.array([[5, 3]], np.int32), 7, beam=4, length_penalty=1.0)
    with pytest.raises(ValueError):
        first["num_beams"][0] = 1  # would change every later search with these settings
    again = contract.search_feeds(np.array([[5, 6, 3]]), 9, beam=4, length_penalty=1.0)
    other = contract.search_feeds(np.array([[5, 3]], np.int32), 7, beam=2,
                                  length_penalty=0.6, n_best=2)
    assert again["num_beams"].tolist() == [4] and again["max_length"].tolist() == [10]
    assert again["input_ids"].dtype == np.int32
    assert other["num_beams"].tolist() == [2] and other["num_return_sequences"].tolist() == [2]
    assert other["length_penalty"].tolist() == [np.float32(0.6)]
    assert first["min_length"].tolist() == [0] and first["repetition_penalty"].tolist() == [1.0]
    assert first[SCORE_SWITCH].tolist() == [1] and first[SCORE_SWITCH].dtype == np.int32
    off = contract.search_feeds(np.array([[5, 3]], np.int32), 7, 4, 1.0, scores=False)
    assert off[SCORE_SWITCH].tolist() == [0] and off["num_beams"].tolist() == [4]


def test_hypotheses_are_read_as_plain_python_numbers():
    # (B=2, N=2, T=4): BOS 2, tokens, PAD 0
    sequences = np.array([[[2, 7, 8, 0], [2, 9, 0, 0]], [[2, 5, 6, 4], [2, 5, 0, 0]]], np.int32)
    scores = np.array([[-0.5, -1.25], [-0.75, -2.0]], np.float32)
    found = contract.parse_hypotheses(sequences, scores, pad=0)
    assert [[h.ids for h in row] for row in found] == [[[7, 8], [9]], [[5, 6, 4], [5]]]
    assert [[h.score for h in row] for row in found] == [[-0.5, -1.25], [-0.75, -2.0]]
    # JSON Lines and the served model write these as they are: numpy scalars would not do
    json.dumps([[h.ids, h.score] for row in found for h in row])
    best = contract.parse_sequences(sequences, pad=0)
    assert best == [[7, 8], [5, 6, 4]] and all(type(t) is int for row in best for t in row)
