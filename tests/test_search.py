"""Greedy and beam search on a rigged scorer whose best sequence greedy cannot find."""

from __future__ import annotations

import math

import pytest
import torch

from src.data.subword import EOS, UNK
from src.nmt.model import ModelConfig, Transformer
from src.nmt.search import beam_search, greedy_search

A, B, C = 4, 5, 6


class RiggedModel:
    """Next-token probabilities depend only on the prefix (BOS excluded), per `TABLE`.

    Greedy takes A (0.5) then B (0.35) then EOS: p = 0.175. The best sequence is B EOS:
    p = 0.36, which a beam of 2 finds. UNK gets the largest logit everywhere and must never
    be chosen.
    """

    TABLE = {
        (): {A: 0.5, B: 0.4, C: 0.1},
        (A,): {EOS: 0.3, B: 0.35, C: 0.35},
        (B,): {EOS: 0.9, C: 0.1},
    }
    max_positions = 32

    def encode(self, src):
        n = src.shape[0]
        return torch.zeros(n, 1, 1), torch.ones(n, 1, 1, 1, dtype=torch.bool)

    def cross_kv(self, memory):
        return [(memory, memory)]

    def empty_cache(self, n, device=None, dtype=None):
        return [(torch.zeros(n, 1, 0, 1), torch.zeros(n, 1, 0, 1))]

    def decode_step(self, tokens, cache, cross, src_mask):
        history = torch.cat([cache[0][0], tokens.float().view(-1, 1, 1, 1)], dim=2)
        logits = torch.full((tokens.shape[0], 8), -1e9)
        for i, row in enumerate(history[:, 0, :, 0].long().tolist()):
            for tok, p in self.TABLE.get(tuple(row[1:]), {EOS: 1.0}).items():
                logits[i, tok] = math.log(p)
            logits[i, UNK] = 10.0
        return logits, [(history, history)]


def test_greedy_follows_local_maxima_and_never_emits_unk():
    src = torch.tensor([[7, EOS], [7, EOS]])
    assert greedy_search(RiggedModel(), src, max_len=10) == [[A, B], [A, B]]


def test_beam_finds_the_better_sequence():
    src = torch.tensor([[7, EOS], [7, EOS], [7, EOS]])
    for length_penalty in (0.0, 1.0):
        assert (
            beam_search(RiggedModel(), src, beam=2, max_len=10, length_penalty=length_penalty)
            == [[B]] * 3
        )


def test_beam_of_one_is_greedy():
    src = torch.tensor([[7, EOS]])
    assert beam_search(RiggedModel(), src, beam=1, max_len=10) == [[A, B]]


def test_max_length_cuts_open_hypotheses():
    src = torch.tensor([[7, EOS]])
    assert greedy_search(RiggedModel(), src, max_len=1) == [[A]]
    assert beam_search(RiggedModel(), src, beam=2, max_len=1) == [[A]]


def test_beam_search_on_a_real_model_is_batch_independent():
    torch.manual_seed(0)
    config = ModelConfig(40, 40, d_model=16, n_heads=2, n_layers=2, ffn_dim=32, dropout=0.0)
    model = Transformer(config).eval()
    src = torch.tensor([[5, 6, 7, EOS], [8, 9, EOS, 0], [10, EOS, 0, 0]])
    together = beam_search(model, src, beam=3, max_len=8)
    alone = [
        beam_search(model, src[i : i + 1, : int((src[i] != 0).sum())], beam=3, max_len=8)[0]
        for i in range(3)
    ]
    assert together == alone
    assert all(UNK not in hyp for hyp in together)


def small_model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(40, 40, d_model=16, n_heads=2, n_layers=2, ffn_dim=32, dropout=0.0,
                         max_positions=12)
    return Transformer(config).eval()


def test_translate_ids_batches_by_length_and_returns_the_input_order():
    from src.nmt.search import length_sorted_batches, translate_ids

    model = small_model()
    sources = [[5, 6, 7, 8], [9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]]
    assert length_sorted_batches(sources, 2) == [[1, 2], [0, 3]]
    assert length_sorted_batches(sources, 3) == [[1, 2, 0], [3]]
    one_by_one = [translate_ids(model, [s], beam=3, length_penalty=0.6, max_length_ratio=1.5,
                                batch_size=1)[0] for s in sources]
    together = translate_ids(model, sources, beam=3, length_penalty=0.6, max_length_ratio=1.5,
                             batch_size=2)
    assert together == one_by_one
    scored = translate_ids(model, sources, beam=3, length_penalty=0.6, max_length_ratio=1.5,
                           batch_size=4, with_scores=True)
    assert [ids for ids, _ in scored] == together
    want = [beam_search(model, torch.tensor([s[:11] + [EOS]]), 3,
                        min(int(1.5 * (len(s[:11]) + 1)) + 10, 11), 0.6, with_scores=True)[0]
            for s in sources]
    # the source clipped to the model, the output limit by ratio
    assert [ids for ids, _ in scored] == [ids for ids, _ in want]
    assert [score for _, score in scored] == pytest.approx([score for _, score in want],
                                                           abs=1e-5)
    greedy = translate_ids(model, sources, beam=1, length_penalty=1.0, max_length_ratio=0.1,
                           batch_size=1)
    assert greedy == [greedy_search(model, torch.tensor([s[:11] + [EOS]]),
                                    min(int(0.1 * (len(s[:11]) + 1)) + 10, 11))[0]
                      for s in sources]


def test_translate_ids_advances_the_progress_by_each_batch():
    from src.nmt.search import translate_ids

    class Progress:
        def __init__(self):
            self.tasks, self.steps = [], []

        def add_task(self, name, total):
            self.tasks.append((name, total))
            return 7

        def advance(self, task, n):
            self.steps.append((task, n))

    progress = Progress()
    translate_ids(small_model(), [[5], [6, 7], [8, 9, 10]], beam=2, length_penalty=1.0,
                  max_length_ratio=1.0, batch_size=2, progress=progress)
    assert progress.tasks == [("translate", 3)] and progress.steps == [(7, 2), (7, 1)]


def test_the_output_limit_follows_the_longest_source_row():
    from src.nmt.search import max_output_length, source_batch

    model = small_model()
    src = source_batch([[5, 6, 7], [8], list(range(5, 25))], [0, 1], model.max_positions)
    assert src.tolist() == [[5, 6, 7, EOS], [8, EOS, 0, 0]]
    assert max_output_length(src, 1.5, model) == 11  # min(int(1.5 x 4) + 10, 12 - 1)
    assert max_output_length(src[1:, :2], 0.5, model) == 11  # min(1 + 10, 11)
    assert max_output_length(src[1:, :2], 0.1, model) == 10
    clipped = source_batch([list(range(5, 25))], [0], model.max_positions)
    assert clipped.shape == (1, 12) and clipped[0, -1] == EOS


# -- hypotheses that end: scores checked against the model itself ------------------------------

class Ends:
    """A small random Transformer whose EOS logit grows by `boost` per decoded token, so that
    rows end at different steps, some before the limit and some at it."""

    def __init__(self, boost: float = 0.5):
        torch.manual_seed(0)
        config = ModelConfig(40, 40, d_model=16, n_heads=2, n_layers=1, ffn_dim=32,
                             dropout=0.0, max_positions=32, tie_embeddings=False)
        self.model = Transformer(config).eval()
        with torch.no_grad():
            for parameter in self.model.parameters():
                if parameter.dim() > 1:
                    parameter.normal_(0, 0.7)
        self.boost, self.max_positions = boost, 32

    def encode(self, src):
        return self.model.encode(src)

    def cross_kv(self, memory):
        return self.model.cross_kv(memory)

    def empty_cache(self, *args):
        return self.model.empty_cache(*args)

    def decode_step(self, tokens, cache, cross, src_mask):
        logits, cache = self.model.decode_step(tokens, cache, cross, src_mask)
        logits = logits.clone()
        logits[:, EOS] += self.boost * cache[0][0].shape[2]
        return logits, cache


ENDS_SRC = torch.tensor([[5, 6, 7, EOS, 0, 0], [8, EOS, 0, 0, 0, 0],
                         [9, 10, 11, 12, 13, EOS], [30, 31, EOS, 0, 0, 0]])


def rescore(model, src_row, ids, max_len, length_penalty=1.0) -> float:
    """A hypothesis's score from the model, token by token with the hypothesis fed in:
    sum(log p) / length**length_penalty, length its tokens + 1: its EOS when it ended before
    max_len (whose log p is summed), the limit when cut there."""
    from src.core.special_ids import BANNED, BOS

    tokens = ids + [EOS] if len(ids) < max_len else ids
    with torch.no_grad():
        memory, mask = model.encode(src_row)
        cross, cache = model.cross_kv(memory), model.empty_cache(1, None, memory.dtype)
        total, previous = 0.0, BOS
        for token in tokens:
            logits, cache = model.decode_step(torch.tensor([[previous]]), cache, cross, mask)
            logits = logits.float()
            logits[:, list(BANNED)] = float("-inf")
            total += float(torch.log_softmax(logits, dim=-1)[0, token])
            previous = token
    return total / (len(ids) + 1) ** length_penalty


def row(i: int) -> torch.Tensor:
    return ENDS_SRC[i : i + 1, : int((ENDS_SRC[i] != 0).sum())]


def test_greedy_scores_rows_that_end_at_different_steps_as_the_model_does():
    model = Ends()
    found = greedy_search(model, ENDS_SRC, 10, with_scores=True)  # length penalty 1 by default
    lengths = [len(ids) for ids, _ in found]
    assert min(lengths) < 10 == max(lengths) and len(set(lengths)) > 2  # ends, and a cut
    for i, (ids, score) in enumerate(found):
        assert score == pytest.approx(rescore(model, row(i), ids, 10), abs=1e-5)
        assert greedy_search(model, row(i), 10, with_scores=True)[0] == (
            ids, pytest.approx(score, abs=1e-5))
    penalised = greedy_search(model, ENDS_SRC, 10, 0.6, with_scores=True)
    assert [ids for ids, _ in penalised] == [ids for ids, _ in found]
    assert penalised[0][1] == pytest.approx(rescore(model, row(0), found[0][0], 10, 0.6),
                                            abs=1e-5)
    assert greedy_search(model, ENDS_SRC, 10) == [ids for ids, _ in found]


def test_a_beam_of_one_is_greedy_with_its_scores_and_penalty():
    model = Ends()
    assert beam_search(model, ENDS_SRC, 1, 10, 0.6, with_scores=True) == greedy_search(
        model, ENDS_SRC, 10, 0.6, with_scores=True)
    assert beam_search(model, ENDS_SRC, 1, 10) == greedy_search(model, ENDS_SRC, 10)


def test_n_best_lists_of_rows_that_end_hold_the_models_scores_best_first():
    model = Ends()
    lists = beam_search(model, ENDS_SRC, 3, 10, n_best=3)  # length penalty 1 by default
    best = beam_search(model, ENDS_SRC, 3, 10, with_scores=True)
    assert any(len(h) < 10 for hyps in lists for h, _ in hyps)  # some end before the limit
    assert any(len(h) == 10 for hyps in lists for h, _ in hyps)  # and some are cut
    for i, hyps in enumerate(lists):
        assert len(hyps) == 3 and len({tuple(h) for h, _ in hyps}) == 3
        scores = [score for _, score in hyps]
        assert scores == sorted(scores, reverse=True) and hyps[0] == best[i]
        for ids, score in hyps:
            assert score == pytest.approx(rescore(model, row(i), ids, 10), abs=1e-5)
        alone = beam_search(model, row(i), 3, 10, n_best=3)[0]
        assert [h for h, _ in alone] == [h for h, _ in hyps]
        assert [s for _, s in alone] == pytest.approx(scores, abs=1e-5)
    penalised = beam_search(model, ENDS_SRC, 3, 10, 0.6, n_best=3)
    for i, hyps in enumerate(penalised):
        for ids, score in hyps:
            assert score == pytest.approx(rescore(model, row(i), ids, 10, 0.6), abs=1e-5)


def test_a_row_open_at_the_limit_offers_its_live_beams_beside_its_finished_ones():
    """Rows whose beams have not all ended by max_len: the live beams are scored as they
    stand and ranked with the hypotheses that did end."""
    model = Ends(boost=0.25)
    lists = beam_search(model, ENDS_SRC, 4, 6, n_best=4)
    mixed = [hyps for hyps in lists if {len(h) < 6 for h, _ in hyps} == {True, False}]
    assert mixed  # a row with ended and cut hypotheses in one list
    for hyps in mixed:
        i = lists.index(hyps)
        for ids, score in hyps:
            assert score == pytest.approx(rescore(model, row(i), ids, 6), abs=1e-5)


def test_the_output_limit_counts_the_longest_row_not_the_batch():
    from src.nmt.search import max_output_length

    src = ENDS_SRC[:2]  # rows of 4 and 2 tokens, 6 in all
    assert max_output_length(src, 1.5, Ends()) == int(1.5 * 4) + 10 == 16


def test_a_beam_wider_than_the_finite_candidates_stops_at_the_first_impossible_one():
    """RiggedModel has five possible tokens (three banned ids are -inf): a beam of 5 takes 10
    candidates, and after the five finite ones it has kept four beams and ended one."""
    src = torch.tensor([[7, EOS]])
    assert beam_search(RiggedModel(), src, beam=5, max_len=5) == [[B]]


def test_an_n_best_list_skips_endings_ranked_past_the_beam_and_keeps_searching():
    """Step 2 of RiggedModel with beam 3: B EOS (p 0.36) ends at rank 0; A B and A C (0.175)
    go on, A EOS (0.15, rank 3) is dropped, B C goes on; A B and A C then end."""
    src = torch.tensor([[7, EOS]])
    found = beam_search(RiggedModel(), src, beam=3, max_len=5, length_penalty=0.0, n_best=3)[0]
    assert found[0][0] == [B] and sorted(ids for ids, _ in found[1:]) == [[A, B], [A, C]]
    assert [score for _, score in found] == pytest.approx([math.log(0.36), math.log(0.175),
                                                           math.log(0.175)], abs=1e-6)
