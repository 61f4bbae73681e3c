"""Pieces of the search Loops (src/graph/search_loop.py) run alone on hand-made logits."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from src.core.special_ids import EOS
from src.graph.search_loop import Nodes, best_token, block_width, top_candidates


def best_token_session(vocab: int) -> ort.InferenceSession:
    """A model of `best_token` alone: logits (N, vocab) and the bool ban -> tokens (N,)."""
    n = Nodes("t/")
    token = best_token(n, "logits", vocab, "eos_banned")
    graph = helper.make_graph(
        n.nodes + [helper.make_node("Identity", [token], ["token"])], "best_token",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, vocab]),
         helper.make_tensor_value_info("eos_banned", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("token", TensorProto.INT64, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def expected(logits: np.ndarray, banned: bool) -> np.ndarray:
    """The first best token of each row, EOS excluded where banned (np.argmax: first of ties)."""
    masked = logits.copy()
    if banned:
        masked[:, EOS] = -np.inf
    return masked.argmax(axis=1)


@pytest.mark.parametrize("vocab, width", [(8000, 125), (120, 60), (1000, 125), (127, None)])
def test_best_token_is_the_first_best_and_skips_a_banned_eos(vocab, width):
    """Blocks of the vocabulary (or TopK where it has no divisor to cut by): the same token as
    an argmax over the row, also where the best sits in EOS's block, at either end of the row,
    where equal logits lie in two blocks or one, and where EOS is best but banned."""
    assert block_width(vocab) == width
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(10, vocab)).astype(np.float32)
    top = float(logits.max()) + 1
    logits[0, EOS] = top                          # EOS best: banned, the second best wins
    logits[1, EOS], logits[1, EOS + 1] = top, top  # EOS tied with its neighbour
    logits[2, vocab - 1] = top                    # the last token
    logits[3, 0] = top                            # the first token (PAD)
    logits[4, [5, vocab - 3]] = top               # equal logits far apart: the first wins
    logits[5, [vocab // 2 + 1, vocab // 2]] = top  # equal neighbours
    logits[6, :] = 0.0                            # all equal: token 0, or 1 with EOS banned
    logits[7, EOS] = top
    logits[7, vocab - 2] = top - 0.5              # second best far from EOS's block
    session = best_token_session(vocab)
    for banned in (False, True):
        got = session.run(None, {"logits": logits, "eos_banned": np.array(banned)})[0]
        np.testing.assert_array_equal(got, expected(logits, banned), err_msg=f"banned={banned}")
    one_row = session.run(None, {"logits": logits[:1], "eos_banned": np.array(False)})[0]
    np.testing.assert_array_equal(one_row, [EOS])


def top_candidates_session(vocab: int) -> ort.InferenceSession:
    """A model of `top_candidates` alone: log-probabilities (N*Kn, 1, V), beam scores (N, Kn),
    2K and the ban -> the 2K best candidates' scores and indices (N, 2K)."""
    n = Nodes("c/")
    n_open = n.op("Shape", "scores", start=0, end=1)
    top_scores, top_ids = top_candidates(n, "logp", "scores", n_open, vocab, "two_beams",
                                         "eos_banned")
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        n.nodes + [helper.make_node("Identity", [top_scores], ["top_scores"]),
                   helper.make_node("Identity", [top_ids], ["top_ids"])], "top_candidates",
        [value("logp", TensorProto.FLOAT, [None, 1, vocab]),
         value("scores", TensorProto.FLOAT, [None, None]),
         value("two_beams", TensorProto.INT64, [1]), value("eos_banned", TensorProto.BOOL, [])],
        [value("top_scores", TensorProto.FLOAT, [None, None]),
         value("top_ids", TensorProto.INT64, [None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def expected_candidates(logp: np.ndarray, scores: np.ndarray, k: int, banned: bool):
    """One sort of all candidates, as a TopK over them ranks them: best first, the lower
    index first among equals; float32 sums in the graph's order (log p + ban, + score)."""
    n, beams = scores.shape
    ban = np.zeros(logp.shape[-1], np.float32)
    if banned:
        ban[EOS] = -np.inf
    candidates = ((logp[:, 0] + ban).reshape(n, beams, -1) + scores[:, :, None]).reshape(n, -1)
    order = np.stack([np.lexsort((np.arange(row.size), -row))[:k] for row in candidates])
    return np.take_along_axis(candidates, order, axis=1), order


@pytest.mark.parametrize("vocab", [8000, 120, 127])
@pytest.mark.parametrize("beams, k", [(1, 8), (4, 8), (3, 6)])
def test_top_candidates_are_one_sort_of_every_candidate(vocab, beams, k):
    """By blocks (8000, 120) or one TopK (127: no divisor): the same scores, bit for bit, and
    the same indices as sorting every candidate, where beams tie across blocks, where a
    block's best ties with another's, where whole blocks are -inf, and where EOS is best but
    banned, and where a later block holds a candidate equal to an earlier block's best (the
    first step has one beam per sentence, fewer blocks than 2K at 120)."""
    rng = np.random.default_rng(1)
    sentences = 3
    logp = rng.normal(-9, 2, size=(sentences * beams, 1, vocab)).astype(np.float32)
    scores = rng.normal(-3, 1, size=(sentences, beams)).astype(np.float32)
    logp[0, 0, EOS] = 0.0                              # EOS best in the first sentence
    logp[beams, 0, [4, vocab - 1, vocab // 2]] = -0.5  # equal candidates in three blocks
    logp[-1, 0, :vocab // 2] = -np.inf                 # half a row banned outright
    # a later block holds the row's best and a candidate equal to an earlier block's best:
    # the earlier one ranks first, as in the row
    logp[beams - 1, 0, [5, vocab - 2, vocab - 1]] = [-0.7, -0.7, -0.3]
    if beams > 1:
        scores[1, :] = scores[1, 0]                    # equal beams: equal candidates
        logp[beams + 1, 0] = logp[beams, 0]
    session = top_candidates_session(vocab)
    for banned in (False, True):
        got_scores, got_ids = session.run(None, {
            "logp": logp, "scores": scores, "two_beams": np.array([k]),
            "eos_banned": np.array(banned)})
        want_scores, want_ids = expected_candidates(logp, scores, k, banned)
        np.testing.assert_array_equal(got_scores, want_scores, err_msg=f"banned={banned}")
        np.testing.assert_array_equal(got_ids, want_ids, err_msg=f"banned={banned}")
