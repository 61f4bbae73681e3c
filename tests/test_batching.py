"""Token batches and their tensors (src/data/batching.py), judged by outcomes: every example in
exactly one batch, none over `max_tokens`, sentences of similar length together, the same
batches for the same seed, the tensors the model reads, and each rank's share of a step."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from src.core.special_ids import BOS, EOS, PAD
from src.data import batching
from src.data.batching import (
    Ragged,
    make_batch,
    pad,
    ragged_column,
    rank_share,
    round_up,
    steps_in_epoch,
    token_batches,
)

RNG = np.random.default_rng(0)
SRC_LENS = RNG.integers(1, 40, 500).tolist()
TGT_LENS = RNG.integers(1, 40, 500).tolist()


def cost(idx, multiple=1):
    """Padded tokens of a batch as make_batch pads it (+EOS on the source, +BOS/EOS on the
    target, widths rounded up to `multiple`)."""
    s = round_up(max(SRC_LENS[i] for i in idx) + 1, multiple)
    t = round_up(max(TGT_LENS[i] for i in idx) + 1, multiple)
    return len(idx) * (s + t)


@pytest.mark.parametrize("multiple", [1, 8])
def test_every_example_in_exactly_one_batch_and_none_over_the_budget(multiple):
    batches = token_batches(SRC_LENS, TGT_LENS, 300, seed=1, length_multiple=multiple)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(SRC_LENS)))
    assert all(cost(b, multiple) <= 300 for b in batches)


@pytest.mark.parametrize("multiple", [1, 8])
def test_a_batch_closes_only_when_the_next_sentence_would_not_fit(multiple):
    """Greedy packing, seen unshuffled in one pool: each batch plus the first sentence of the
    next would go over the budget."""
    batches = token_batches(SRC_LENS[:60], TGT_LENS[:60], 300, seed=0, shuffle=False,
                            length_multiple=multiple)
    for batch, following in zip(batches, batches[1:]):
        assert cost(batch, multiple) <= 300 < cost(batch + following[:1], multiple)


def test_an_example_over_the_budget_alone_gets_a_batch_of_its_own():
    batches = token_batches([3, 200, 3], [3, 200, 3], 50, seed=0, shuffle=False)
    assert sorted(map(sorted, batches)) == [[0, 2], [1]]


def test_the_budget_counts_the_padded_widths_of_the_longest_sentences():
    # two sentences of 4 + 4 tokens cost 2 x (5 + 5) = 20 padded tokens with EOS/BOS
    assert token_batches([4, 4], [4, 4], 20, seed=0, shuffle=False) == [[0, 1]]
    assert token_batches([4, 4], [4, 4], 19, seed=0, shuffle=False) == [[0], [1]]
    # rounded up to 8: (8 + 8) x 2 = 32
    assert token_batches([4, 4], [4, 4], 32, seed=0, shuffle=False,
                         length_multiple=8) == [[0, 1]]
    assert token_batches([4, 4], [4, 4], 31, seed=0, shuffle=False,
                         length_multiple=8) == [[0], [1]]
    # the longest target sets the width even when its source is short
    assert token_batches([4, 1], [1, 9], 30, seed=0, shuffle=False) == [[1, 0]]  # 2 x (5 + 10)
    assert token_batches([4, 1], [1, 9], 29, seed=0, shuffle=False) == [[1], [0]]


def test_without_shuffling_a_pool_is_sorted_by_source_then_target_length():
    src = [5, 1, 3, 1, 5]
    tgt = [1, 9, 2, 2, 0]
    assert token_batches(src, tgt, 1000, seed=0, shuffle=False) == [[3, 1, 2, 4, 0]]


def test_sentences_of_similar_length_share_a_batch():
    batches = token_batches(SRC_LENS, TGT_LENS, 300, seed=2)
    spread = np.mean([max(SRC_LENS[i] for i in b) - min(SRC_LENS[i] for i in b)
                      for b in batches if len(b) > 1])
    assert spread < 3  # random batches of 500 lengths in 1..39 would spread ~25


def test_the_batches_and_their_order_depend_on_the_seed_only():
    first = token_batches(SRC_LENS, TGT_LENS, 300, seed=7)
    assert first == token_batches(SRC_LENS, TGT_LENS, 300, seed=7)
    other = token_batches(SRC_LENS, TGT_LENS, 300, seed=8)
    assert first != other and sorted(map(sorted, first)) != sorted(map(sorted, other))
    # the order of batches is shuffled too: not by length
    widths = [max(SRC_LENS[i] for i in b) for b in first]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_pools_bound_how_far_sorting_reaches(monkeypatch):
    """Sorting happens inside pools of ~POOL_BATCHES batches: with pools of one batch each,
    batches hold sentences of any length; with the default, similar ones."""
    monkeypatch.setattr(batching, "POOL_BATCHES", 1)
    small_pools = token_batches(SRC_LENS, TGT_LENS, 300, seed=2)
    spread = np.mean([max(SRC_LENS[i] for i in b) - min(SRC_LENS[i] for i in b)
                      for b in small_pools if len(b) > 1])
    assert spread > 5
    assert sorted(i for b in small_pools for i in b) == list(range(500))


def test_no_examples_no_batches():
    assert token_batches([], [], 100, seed=0) == []


# -- tensors -----------------------------------------------------------------------------------

def test_pad_rounds_the_width_up_and_fills_with_pad():
    assert pad([[5, 6, 7], [8]]).tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert pad([[5, 6, 7], [8]], multiple=4).tolist() == [[5, 6, 7, PAD], [8, PAD, PAD, PAD]]
    assert pad([[5, 6, 7, 8]], multiple=4).shape == (1, 4)
    assert pad([np.array([9, 10])]).dtype == batching.torch.int64
    assert round_up(np.array([1, 8, 9]), 8).tolist() == [8, 8, 16] and round_up(0, 8) == 0


def test_long_sentences_are_clipped_to_the_model_with_eos_kept():
    batch = make_batch([list(range(10, 30))], [list(range(40, 60))], max_positions=8)
    assert batch.src.tolist() == [[10, 11, 12, 13, 14, 15, 16, EOS]]
    assert batch.tgt_in.tolist() == [[BOS, 40, 41, 42, 43, 44, 45, 46]]
    assert batch.tgt_out.tolist() == [[40, 41, 42, 43, 44, 45, 46, EOS]]
    assert batch.n_tokens == 16
    assert batching.clip_source([1, 2], 8) == [1, 2, EOS]


def test_a_batch_moves_to_a_device_whole():
    batch = make_batch([[5, 6]], [[7]], max_positions=16).to("cpu")
    assert batch.src.tolist() == [[5, 6, EOS]] and batch.tgt_out.tolist() == [[7, EOS]]
    assert batch.tgt_in.tolist() == [[BOS, 7]]


# -- steps and ranks ---------------------------------------------------------------------------

def test_one_process_takes_a_short_last_step_and_ranks_drop_the_remainder():
    assert batching.batches_per_step(3, 2) == 6
    assert steps_in_epoch(10, 3, 1) == 4  # 3 + 3 + 3 + 1
    assert steps_in_epoch(9, 3, 1) == 3
    assert steps_in_epoch(10, 1, 2) == 5
    assert steps_in_epoch(11, 1, 2) == 5  # the eleventh batch is dropped
    assert steps_in_epoch(13, 3, 2) == 2


def test_each_rank_takes_its_own_batches_of_a_step():
    group = ["a", "b", "c", "d", "e", "f"]
    assert rank_share(group, 0, 2) == ["a", "c", "e"]
    assert rank_share(group, 1, 2) == ["b", "d", "f"]
    assert rank_share(group, 0, 1) == group


# -- ragged id rows ----------------------------------------------------------------------------

def test_ragged_rows_round_trip_with_lengths():
    rows = [[5, 6, 7], [], [8], [9, 10]]
    ragged = Ragged.from_rows(rows)
    assert len(ragged) == 4 and ragged.tolist() == rows
    assert ragged.lengths().tolist() == [3, 0, 1, 2]
    assert ragged[3].tolist() == [9, 10] and ragged.values.dtype == np.int32
    assert Ragged.from_rows([]).tolist() == []


def test_an_arrow_column_of_several_chunks_reads_as_one_ragged_array():
    column = pa.chunked_array([pa.array([[1, 2], [3]], pa.list_(pa.int64())),
                               pa.array([[], [4, 5, 6]], pa.list_(pa.int64()))])
    ragged = ragged_column(column)
    assert ragged.tolist() == [[1, 2], [3], [], [4, 5, 6]]
    assert ragged.offsets.tolist() == [0, 2, 3, 3, 6] and ragged.values.dtype == np.int32


def test_a_budget_below_one_example_sorts_nothing_across_examples():
    """Pools of at least one example: with a budget far below an example's tokens, each
    example is its own pool and its own batch, in the (unshuffled) corpus order."""
    assert token_batches([100, 50, 70], [100, 50, 70], 1, seed=0, shuffle=False) == [
        [0], [1], [2]]


def test_an_empty_arrow_column_is_an_empty_ragged_array():
    ragged = ragged_column(pa.chunked_array([], type=pa.list_(pa.int64())))
    assert ragged.tolist() == [] and len(ragged) == 0
    assert ragged.values.dtype == np.int32 and ragged.values.shape == (0,)
    assert ragged.offsets.tolist() == [0]


def test_ragged_take_gives_the_rows_asked_for_in_order_repeats_included():
    rows = Ragged.from_rows([[1], [2, 3], [], [4, 5, 6]])
    assert rows.take(np.array([3, 1, 1, 2, 0])).tolist() == [[4, 5, 6], [2, 3], [2, 3], [], [1]]
    assert rows.take(np.array([], np.int64)).tolist() == []


def test_both_sides_are_padded_to_the_length_multiple():
    batch = make_batch([[5] * 9, [6]], [[7] * 3, [8]], max_positions=64, length_multiple=8)
    assert batch.src.shape == (2, 16) and batch.tgt_in.shape == batch.tgt_out.shape == (2, 8)


def test_the_encoded_splits_are_read_back_as_ragged_arrays(tmp_path):
    from datasets import Dataset, DatasetDict

    from src.data.batching import load_encoded

    DatasetDict({"train": Dataset.from_dict({"source_ids": [[5, 6], [7]],
                                             "target_ids": [[8], [9, 10, 11]]}),
                 "valid": Dataset.from_dict({"source_ids": [[12]], "target_ids": [[13]]})}
                ).save_to_disk(str(tmp_path / "tokenized"))
    source, target = load_encoded(tmp_path / "tokenized", "train")
    assert source.tolist() == [[5, 6], [7]] and target.tolist() == [[8], [9, 10, 11]]
    assert load_encoded(tmp_path / "tokenized", "valid")[1].tolist() == [[13]]
