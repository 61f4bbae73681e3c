"""Graph surgery of src/graph/onnx_graph.py on hand-built graphs."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from src.graph.onnx_graph import SHARE_MIN_ELEMENTS, share_initializers


def graph_reading(name: str, tensors: dict[str, np.ndarray]):
    """A graph whose one Concat reads every tensor (so renames are visible in its inputs)."""
    node = helper.make_node("Concat", list(tensors), ["out"], axis=0)
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(a, n) for n, a in tensors.items()]
    return helper.make_graph([node], name, [], [out], inits)


def test_equal_tensors_repeated_in_both_subgraphs_are_stored_once():
    """Per-channel int8 zero points of equal width are equal tensors, several per subgraph:
    every copy must read the one outer tensor (this crashed the int8 export before)."""
    zeros = np.zeros(SHARE_MIN_ELEMENTS, dtype=np.float32)
    table = np.arange(SHARE_MIN_ELEMENTS, dtype=np.float32)
    small = np.ones(4, dtype=np.float32)  # below the size worth sharing
    encoder = graph_reading("encoder", {"e_zp1": zeros, "e_zp2": zeros.copy(), "e_table": table,
                                        "e_small": small})
    decoder = graph_reading("decoder", {"d_zp1": zeros.copy(), "d_zp2": zeros.copy(),
                                        "d_table": table.copy(), "d_small": small.copy()})
    shared = share_initializers(encoder, decoder)
    assert sorted(t.name for t in shared) == ["shared_0", "shared_1"]
    by_name = {t.name: numpy_helper.to_array(t) for t in shared}
    enc_inputs, dec_inputs = list(encoder.node[0].input), list(decoder.node[0].input)
    assert enc_inputs[0] == enc_inputs[1] == dec_inputs[0] == dec_inputs[1]
    assert enc_inputs[2] == dec_inputs[2] != enc_inputs[0]
    np.testing.assert_array_equal(by_name[enc_inputs[0]], zeros)
    np.testing.assert_array_equal(by_name[enc_inputs[2]], table)
    assert [t.name for t in encoder.initializer] == ["e_small"]
    assert [t.name for t in decoder.initializer] == ["d_small"]
