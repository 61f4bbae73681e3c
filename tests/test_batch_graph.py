"""The runtime's hand-written protobuf (src/runtime/proto_wire.py) and the cut that takes the
BeamSearch operator out of a file for batches (src/runtime/batch_graph.py), on graphs built
here; the exported files themselves are in tests/test_export.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from src.runtime import batch_graph, proto_wire


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16_383, 16_384, 2**35 + 7])
def test_a_varint_reads_back_as_written(value):
    data = proto_wire.varint(value) + b"\x05"
    assert proto_wire._varint(data, 0, len(data)) == (value, len(data) - 1)


def test_fields_written_are_the_fields_read():
    data = proto_wire.field_bytes(3, 300) + proto_wire.field_bytes(9, b"x" * 200)
    read = list(proto_wire.spans(data))
    assert [(f, w) for f, w, _, _ in read] == [(3, 0), (9, 2)]
    assert read[0][2] == 300 and data[slice(*read[1][2])] == b"x" * 200
    assert [begin for *_, begin in read] == [0, len(proto_wire.field_bytes(3, 300))]


def two_searches(with_loop: bool = True, outputs=batch_graph.OPERATOR_OUTPUTS) -> bytes:
    """A graph shaped like the exported files' main graph: a BeamSearch node (its subgraphs
    stand-ins) writing `outputs`, and a Loop whose output reads them as what it passes on."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", [outputs[0]], ["seq_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("seq_out", TensorProto.INT32, None)])
    stand_in = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "sub",
                                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                                 [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("BeamSearch", ["input_ids"], list(outputs), domain="com.microsoft",
                              encoder=stand_in, decoder=stand_in, decoder_start_token_id=2,
                              eos_token_id=3, pad_token_id=0),
             helper.make_node("Add", ["x", "w"], ["y"])]
    if with_loop:
        nodes.append(helper.make_node("Loop", ["trips", ""], ["scan"], body=body))
    graph = helper.make_graph(
        nodes, "main", [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, 3]),
                        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([1.5, 2.5], np.float32), "w"),
         numpy_helper.from_array(np.array(0, np.int64), "trips")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    helper.set_model_props(model, {"format": "nmt-onnx-1", "note": "kept"})
    return model.SerializeToString()


def test_the_cut_takes_out_the_operator_and_makes_its_outputs_constants():
    original = onnx.load_from_string(two_searches())
    cut = onnx.load_from_string(batch_graph.without_operator(two_searches()))
    assert [n.op_type for n in cut.graph.node] == ["Add", "Loop"]
    assert cut.graph.node[1] == original.graph.node[2]  # the Loop and its body, byte for byte
    constants = {t.name: numpy_helper.to_array(t) for t in cut.graph.initializer}
    assert constants.keys() == {"w", "trips", *batch_graph.OPERATOR_OUTPUTS}
    sequences, scores = (constants[name] for name in batch_graph.OPERATOR_OUTPUTS)
    assert (sequences.dtype, sequences.shape) == (np.int32, (1, 1, 1))
    assert (scores.dtype, scores.shape) == (np.float32, (1, 1))
    assert np.array_equal(constants["w"], [1.5, 2.5])
    assert cut.metadata_props == original.metadata_props
    assert (cut.graph.input, cut.graph.output) == (original.graph.input, original.graph.output)


@pytest.mark.parametrize("model", [two_searches(with_loop=False),
                                   two_searches(outputs=("sequences", "sequences_scores")),
                                   b""])
def test_a_file_whose_batches_the_operator_searches_is_not_cut(model):
    """Without a Loop beside it (files before the Loops), or with other
    outputs, the operator is each batch's search: nothing to cut."""
    assert batch_graph.without_operator(model) is None


@pytest.mark.parametrize("has_pread", [True, False])
def test_pieces_are_written_from_the_file_or_the_mapping(tmp_path, monkeypatch, has_pread):
    """Ranges are read with os.pread from the file (the copied pages never count in the
    process's memory), or through the mapping where os has no pread (Windows): the same
    bytes."""
    import mmap
    import os

    source = tmp_path / "model.onnx"
    source.write_bytes(bytes(range(256)) * 20)
    if not has_pread:
        monkeypatch.delattr(os, "pread")
    pieces = [b"head", (3, 4000), b"", (5000, 5120), b"tail"]
    written = tmp_path / "cut.onnx"
    with source.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped, \
            written.open("wb") as out:
        batch_graph.write_pieces(mapped, pieces, out, chunk=1000, source=fh.fileno())
    data = source.read_bytes()
    assert written.read_bytes() == b"head" + data[3:4000] + data[5000:5120] + b"tail"
