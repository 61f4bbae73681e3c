"""`search_loop.keep_best`, the n-best merge of the search Loop, on hand-made values: which
hypotheses it keeps, in which order among equal scores, and where it writes them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from src.core.special_ids import PAD
from src.graph import search_loop

NAMES = {"best": "best", "out": "out", "out_scores": "out_scores", "sents": "sents"}
OUTER = {"returns_1": "returns_1", "max_new": "max_new"}
INPUTS = {"best": TensorProto.FLOAT, "out": TensorProto.INT32, "out_scores": TensorProto.FLOAT,
          "sents": TensorProto.INT64, "scores": TensorProto.FLOAT,
          "hypotheses": TensorProto.INT32, "length": TensorProto.INT64,
          "returns_1": TensorProto.INT64, "max_new": TensorProto.INT64}


def keep_best(feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = search_loop.Nodes("t/")
    outputs = search_loop.keep_best(n, NAMES, "scores", "hypotheses", "length", OUTER)
    graph = helper.make_graph(
        n.nodes, "keep_best", [helper.make_tensor_value_info(k, t, None)
                               for k, t in INPUTS.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(
            outputs, (TensorProto.FLOAT, TensorProto.INT32, TensorProto.FLOAT))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return tuple(session.run(None, feeds))


def test_the_kept_ones_come_first_among_equal_scores_then_the_new_in_order():
    inf = float("-inf")
    # three sentences, two still open (rows 2 and 0 of the output), three best kept each;
    # output rows of 5 tokens
    out = np.full((3, 3, 5), PAD, np.int32)
    out[2, 0, :2], out[2, 1, :1] = [11, 12], [13]
    out[1, 0, :3] = [7, 7, 7]  # a done sentence: never touched
    out_scores = np.array([[inf] * 3, [-0.5, inf, inf], [-1.0, -3.0, inf]], np.float32)
    feeds = {
        "best": np.array([[-1.0, -3.0, inf], [inf, inf, inf]], np.float32),
        "out": out, "out_scores": out_scores, "sents": np.array([2, 0], np.int64),
        # each open sentence's new hypotheses (-inf: not one), two tokens each
        "scores": np.array([[-3.0, -4.0, inf], [-2.0, inf, -2.0]], np.float32),
        "hypotheses": np.array([[[21, 22], [23, 24], [25, 26]],
                                [[31, 32], [33, 34], [35, 36]]], np.int32),
        "length": np.array(2, np.int64), "returns_1": np.array([3], np.int64),
        "max_new": np.array([5], np.int64)}
    best, new_out, new_scores = keep_best(feeds)
    # sentence 2: -1 and -3 kept, then the new -3 after the kept -3 (equal: kept first)
    np.testing.assert_array_equal(best, [[-1.0, -3.0, -3.0], [-2.0, -2.0, inf]])
    np.testing.assert_array_equal(new_out[2], [[11, 12, PAD, PAD, PAD], [13, PAD, PAD, PAD, PAD],
                                               [21, 22, PAD, PAD, PAD]])
    # sentence 0: the two new -2s in their order, then what it held (nothing)
    np.testing.assert_array_equal(new_out[0], [[31, 32, PAD, PAD, PAD], [35, 36, PAD, PAD, PAD],
                                               [PAD] * 5])
    np.testing.assert_array_equal(new_out[1], out[1])
    np.testing.assert_array_equal(new_scores, [[-2.0, -2.0, inf], [-0.5, inf, inf],
                                               [-1.0, -3.0, -3.0]])
