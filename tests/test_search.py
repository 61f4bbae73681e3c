"""Greedy and beam search on a rigged scorer whose best sequence greedy cannot find."""

from __future__ import annotations

import math

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
