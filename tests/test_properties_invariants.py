"""Property-based tests of what holds for every input: mixing corpora by weight, token-count
batching, and the beam search in PyTorch (the exported ONNX file on the same sentences is in
tests/test_properties_onnx.py, apart so that the mutation kit can run this file quickly).

Hypothesis runs a fixed number of derandomized examples per property (the same inputs on every
run and in CI); a failure it found is kept below as an `@example` with what it found.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams
from src.core.special_ids import BANNED
from src.data.batching import make_batch, round_up, token_batches
from src.data.mixing import CorpusFile, mix
from src.data.subword import BOS, EOS, PAD
from src.nmt.model import ModelConfig, Transformer
from src.nmt.search import beam_search, greedy_search

PURE = settings(max_examples=200, deadline=None, derandomize=True)
MIXING = settings(max_examples=120, deadline=None, derandomize=True)  # files, Arrow per example
TORCH = settings(max_examples=25, deadline=None, derandomize=True)
PAIR = PairParams(source_lang="en", target_lang="zh", source_column=0, target_column=1)
VOCAB, MAX_POSITIONS = 40, 32

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py




# -- mixing ------------------------------------------------------------------------------------
# few distinct sentences, so corpora share pairs and sources, and test sets hit them
SOURCES = st.sampled_from([f"s{i}" for i in range(12)])
TARGETS = st.sampled_from([f"t{i}" for i in range(4)])
PAIRS = st.lists(st.tuples(SOURCES, TARGETS), min_size=1, max_size=25)
WEIGHTS = st.floats(0.05, 4.0) | st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])
SIZES = st.integers(1, 3) | st.floats(0.05, 0.4)


def write_corpus(directory: str, name: str, pairs: list[tuple[str, str]],
                 weight: float) -> CorpusFile:
    path = Path(directory, f"{name}.tsv")
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return CorpusFile(name, path, weight)


def part_pairs(mixed, name: str) -> list[tuple[str, str]]:
    table = mixed.parts[name]
    return list(zip(table["source"].to_pylist(), table["target"].to_pylist()))


@MIXING
@given(st.lists(st.tuples(PAIRS, WEIGHTS), min_size=1, max_size=3), SIZES, SIZES,
       st.integers(0, 3), st.none() | st.lists(st.tuples(SOURCES, TARGETS), min_size=1,
                                               max_size=3),
       st.frozensets(SOURCES, max_size=2), st.sampled_from([1.0, 1.0, 0.5]))
def test_mixing_counts_are_exact_reproducible_and_no_training_source_is_tested(
        corpora, valid_size, test_size, seed, test, held_out, train_fraction):
    cfg = SplitParams(seed=seed, valid_size=valid_size, test_size=test_size, max_chars=300,
                      train_fraction=train_fraction)
    with tempfile.TemporaryDirectory() as tmp:
        files = [write_corpus(tmp, f"c{i}", pairs, weight)
                 for i, (pairs, weight) in enumerate(corpora)]
        try:
            mixed = mix(files, PAIR, cfg, test, held_out)
        except PipelineError as exc:
            assert len(str(exc).splitlines()) == 1
            if "no valid" in str(exc):
                assert not any(pairs for pairs, _ in corpora)
            else:  # split.valid_size/test_size: a fraction of the source sentences or a count
                tested = {s for s, _ in test or ()} | held_out
                n = len({s for pairs, _ in corpora for s, _ in pairs} - tested)
                wanted = [round(size * n) if size < 1 else int(size)
                          for size in (valid_size, 0 if test else test_size)]
                assert "leave none" in str(exc) and sum(wanted) >= n
            return
        again = mix(files, PAIR, cfg, test, held_out)
    names = ("train", "valid", "test")
    assert {n: part_pairs(again, n) for n in names} == {n: part_pairs(mixed, n) for n in names}
    assert again.counts == mixed.counts

    # the pair's owner is the first corpus listing it; sources of a test set are left out
    owner: dict[tuple[str, str], int] = {}
    for index, (pairs, _) in enumerate(corpora):
        for one in pairs:
            owner.setdefault(one, index)
    tested = {s for s, _ in test or ()} | held_out
    train, valid = part_pairs(mixed, "train"), part_pairs(mixed, "valid")
    sources = {name: {s for s, _ in part_pairs(mixed, name)} for name in names}
    assert not sources["train"] & tested and not sources["valid"] & tested
    assert not sources["train"] & sources["valid"]
    assert not sources["train"] & sources["test"] and not sources["valid"] & sources["test"]
    if test:
        assert part_pairs(mixed, "test") == list(test)

    copies = Counter(train)
    for index, (pairs, weight) in enumerate(corpora):
        counts = mixed.counts[f"c{index}"]
        mine = {one for one, at in owner.items() if at == index}
        assert counts["read"] == len(pairs)
        assert counts["dropped_duplicate"] == len(pairs) - len(mine)
        assert counts["kept"] + counts["dropped_in_test_set"] + counts[
            "unused_by_train_fraction"] == len(mine)
        assert counts["dropped_in_test_set"] == sum(s in tested for s, _ in mine)
        assert counts["valid"] == sum(one in set(valid) for one in mine)
        # the pairs of training sources: each taken `floor(weight)` times, round(fraction x
        # pairs) of them once more; those train_fraction leaves unused, never
        held = tested | sources["valid"] | sources["test"]
        trained = [one for one in mine if one[0] not in held]
        n_train, unused = counts["train"], counts["unused_by_train_fraction"]
        assert len(trained) == n_train + unused
        whole = math.floor(weight)
        extra = round((weight - whole) * n_train)
        assert sorted((copies[one] for one in trained), reverse=True) == \
            [whole + 1] * extra + [whole] * (n_train - extra) + [0] * unused
        assert counts["train_weighted"] == whole * n_train + extra
    assert len(train) == sum(c["train_weighted"] for c in mixed.counts.values())


# -- batching ----------------------------------------------------------------------------------
LENGTHS = st.lists(st.integers(0, 40), max_size=80)


@PURE
@given(LENGTHS, st.data(), st.integers(1, 600), st.integers(0, 2**32),
       st.sampled_from([1, 1, 2, 8]), st.booleans())
def test_every_example_is_in_exactly_one_batch_within_max_tokens(src_lens, data, max_tokens,
                                                                 seed, length_multiple,
                                                                 shuffle):
    tgt_lens = data.draw(st.lists(st.integers(0, 40), min_size=len(src_lens),
                                  max_size=len(src_lens)))
    batches = token_batches(src_lens, tgt_lens, max_tokens, seed, shuffle, length_multiple)
    assert sorted(i for batch in batches for i in batch) == list(range(len(src_lens)))
    for batch in batches:
        assert batch
        width = (max(round_up(src_lens[i] + 1, length_multiple) for i in batch)
                 + max(round_up(tgt_lens[i] + 1, length_multiple) for i in batch))
        # an example alone over the budget is its own batch: it cannot be split
        assert len(batch) * width <= max_tokens or len(batch) == 1
    assert token_batches(src_lens, tgt_lens, max_tokens, seed, shuffle,
                         length_multiple) == batches
    if not shuffle:  # the seed only shuffles
        assert token_batches(src_lens, tgt_lens, max_tokens, seed + 1, False,
                             length_multiple) == batches


@PURE
@given(st.lists(st.tuples(st.lists(st.integers(4, 99), max_size=40),
                          st.lists(st.integers(4, 99), max_size=40)), min_size=1, max_size=12),
       st.integers(2, 48), st.sampled_from([1, 1, 2, 8]), st.integers(8, 400))
def test_a_padded_batch_holds_each_example_and_stays_within_max_tokens(examples, max_positions,
                                                                       length_multiple,
                                                                       max_tokens):
    """make_batch pads each of token_batches' batches to no more tokens than it was costed at,
    and every row holds its example: source clipped + EOS, BOS + target, target + EOS."""
    sources, targets = [s for s, _ in examples], [t for _, t in examples]
    batches = token_batches([len(s) for s in sources], [len(t) for t in targets], max_tokens,
                            0, True, length_multiple)
    for idx in batches:
        batch = make_batch([sources[i] for i in idx], [targets[i] for i in idx], max_positions,
                           length_multiple)
        assert batch.src.shape[1] <= max_positions and batch.tgt_in.shape[1] <= max_positions
        assert batch.tgt_in.shape == batch.tgt_out.shape
        if len(idx) > 1:
            assert len(idx) * (batch.src.shape[1] + batch.tgt_in.shape[1]) <= max_tokens
        for row, i in enumerate(idx):
            src = sources[i][: max_positions - 1] + [EOS]
            tgt = targets[i][: max_positions - 1]
            assert batch.src[row].tolist() == src + [PAD] * (batch.src.shape[1] - len(src))
            width = batch.tgt_in.shape[1] - len(tgt) - 1
            assert batch.tgt_in[row].tolist() == [BOS] + tgt + [PAD] * width
            assert batch.tgt_out[row].tolist() == tgt + [EOS] + [PAD] * width
        assert batch.n_tokens == sum(len(sources[i][: max_positions - 1]) + 1
                                     + len(targets[i][: max_positions - 1]) + 1 for i in idx)


# -- beam search on a tiny random model ------------------------------------------------------
def tiny_model() -> Transformer:
    """Untrained, weights spread wide and EOS favoured a little, so its outputs depend on the
    source, differ in length and often end before the length limit."""
    torch.manual_seed(0)
    config = ModelConfig(VOCAB, VOCAB, d_model=16, n_heads=2, n_layers=1, ffn_dim=32,
                         dropout=0.0, max_positions=MAX_POSITIONS, tie_embeddings=False)
    model = Transformer(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.7)
        model.generator.weight[EOS] += 0.3
    return model


@functools.cache
def shared_model() -> Transformer:
    """One per session; not a fixture, so Hypothesis does not print it with each example."""
    return tiny_model()


SENTENCE = st.lists(st.integers(4, VOCAB - 1), max_size=8).map(lambda ids: ids + [EOS])
BATCH = st.lists(SENTENCE, min_size=1, max_size=4)


def padded(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def rescored(model: Transformer, src: torch.Tensor, ids: list[int], max_len: int,
             length_penalty: float) -> float:
    """A hypothesis's score from one teacher-forced pass: sum(log p) / length**penalty, length
    its tokens + 1: its EOS when it ended before max_len (whose log p is summed), the limit
    when cut there (the search's own bookkeeping is not consulted)."""
    tokens = ids + [EOS] if len(ids) < max_len else ids
    if not tokens:
        return 0.0
    with torch.no_grad():
        logits = model(src, torch.tensor([[BOS] + tokens[:-1]]))  # (1, T, V)
    logits = logits[0].float()
    logits[:, list(BANNED)] = float("-inf")  # PAD, BOS, UNK are never chosen
    logp = torch.log_softmax(logits, dim=-1)
    total = float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())
    return total / (len(ids) + 1) ** length_penalty


@TORCH
@given(BATCH, st.integers(0, 8), st.sampled_from([0.0, 0.6, 1.0]))
# found while writing this test: max_len 0 (a model with max_positions 1) divided by zero when
# the beam's live hypotheses were scored (0 / 0**penalty), where greedy returns an empty output
@example([[5, EOS]], 0, 1.0)
def test_a_beam_of_one_searches_as_greedy(rows, max_len, length_penalty):
    """beam 1 through the beam loop (an n-best list of one), not the shortcut to greedy."""
    model, src = shared_model(), padded(rows)
    greedy = greedy_search(model, src, max_len, length_penalty, with_scores=True)
    beam = beam_search(model, src, 1, max_len, length_penalty, n_best=1)
    assert [hyps[0][0] for hyps in beam] == [ids for ids, _ in greedy]
    np.testing.assert_allclose([hyps[0][1] for hyps in beam], [s for _, s in greedy],
                               rtol=1e-5, atol=1e-6)


@TORCH
@given(BATCH, st.integers(2, 4), st.integers(0, 8), st.sampled_from([0.0, 0.6, 1.0]))
@example([[5, EOS]], 2, 0, 1.0)  # see test_a_beam_of_one_searches_as_greedy
def test_n_best_lists_are_distinct_sorted_and_scored_as_the_model_scores_them(
        rows, beam, max_len, length_penalty):
    model, src = shared_model(), padded(rows)
    lists = beam_search(model, src, beam, max_len, length_penalty, n_best=beam)
    best = beam_search(model, src, beam, max_len, length_penalty, with_scores=True)
    for i, hyps in enumerate(lists):
        assert 1 <= len(hyps) <= beam
        ids = [tuple(h) for h, _ in hyps]
        scores = [s for _, s in hyps]
        assert len(set(ids)) == len(ids)
        assert scores == sorted(scores, reverse=True)
        assert hyps[0] == best[i]
        row = src[i : i + 1, : len(rows[i])]
        for h, score in hyps:
            assert len(h) <= max_len and not {PAD, BOS, EOS} & set(h)
            assert score == pytest.approx(rescored(model, row, h, max_len, length_penalty),
                                          rel=1e-4, abs=1e-5)


def test_rescoring_agrees_with_greedy_on_a_fixed_sentence():
    """The rescoring helper above, checked once against greedy's own bookkeeping."""
    model, src = shared_model(), padded([[7, 8, 9, EOS]])
    [(ids, score)] = greedy_search(model, src, 6, 1.0, with_scores=True)
    assert score == pytest.approx(rescored(model, src, ids, 6, 1.0), rel=1e-5)
