"""Pieces of the search Loops (src/graph/search_loop.py) run alone on hand-made logits."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from src.core.special_ids import EOS
from src.graph.search_loop import Nodes, best_token, block_width


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
