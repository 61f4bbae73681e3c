"""The runtime's one-sentence cut (src/runtime/operator_graph.py) on graphs built here: the
BeamSearch operator alone, each subgraph holding the weights it reads. Its translations against
the file's own session: tests/test_export.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from src.runtime import batch_graph, contract, operator_graph

FLOAT, INT32 = TensorProto.FLOAT, TensorProto.INT32


def weight(name: str, value: float) -> TensorProto:
    return numpy_helper.from_array(np.full((2,), value, np.float32), name)


def exported_like(with_loop: bool = True, inputs=("input_ids",),
                  outputs=("sequences", "sequences_scores")) -> bytes:
    """A main graph shaped like the exported files': the weights in it, read by the operator's
    encoder (one of them inside an If of its own) and decoder and by a Loop; the operator reads
    switched inputs; a value_info in the decoder describes an outer weight."""
    def value(name, kind=FLOAT):
        return helper.make_tensor_value_info(name, kind, None)

    branch = helper.make_graph([helper.make_node("Add", ["a", "deep_w"], ["c"])], "branch", [],
                               [value("c")])
    encoder = helper.make_graph(
        [helper.make_node("Add", ["a", "shared_w"], ["b"]),
         helper.make_node("If", ["flag"], ["d"], then_branch=branch, else_branch=branch)],
        "encoder", [value("a"), value("flag", TensorProto.BOOL)], [value("b"), value("d")])
    decoder = helper.make_graph(
        [helper.make_node("Mul", ["a", "shared_w"], ["b"]),
         helper.make_node("Mul", ["b", "decoder_w"], ["e"])],
        "decoder", [value("a")], [value("e")], [weight("own_w", 9.0)],
        value_info=[helper.make_tensor_value_info("decoder_w", FLOAT, [2])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["loop_w", "shared_w"], ["acc"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), value("acc")])
    nodes = [helper.make_node("Identity", ["input_ids"], ["operator_ids"]),
             helper.make_node("BeamSearch", ["operator_ids", "operator_max_length"],
                              list(batch_graph.OPERATOR_OUTPUTS), domain="com.microsoft",
                              encoder=encoder, decoder=decoder, decoder_start_token_id=2,
                              eos_token_id=3, pad_token_id=0, model_type=1)]
    if with_loop:
        nodes.append(helper.make_node("Loop", ["trips", ""], ["scan"], body=body))
    graph = helper.make_graph(
        nodes, "main", [helper.make_tensor_value_info(name, INT32, None) for name in inputs],
        [value(name) for name in outputs],
        [weight("shared_w", 1.0), weight("deep_w", 2.0), weight("decoder_w", 3.0),
         weight("loop_w", 4.0), numpy_helper.from_array(np.array(0, np.int32), "pad_id"),
         numpy_helper.from_array(np.array(0, np.int64), "trips")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    helper.set_model_props(model, {"format": "nmt-onnx-1", "note": "kept"})
    return model.SerializeToString()


def subgraphs(node: onnx.NodeProto) -> dict[str, onnx.GraphProto]:
    return {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}


def test_the_operator_alone_holds_the_weights_each_subgraph_reads():
    original = onnx.load_from_string(exported_like())
    alone = onnx.load_from_string(operator_graph.operator_only(exported_like()))
    assert [n.op_type for n in alone.graph.node] == ["Equal", "Not", "Cast", "BeamSearch"]
    search = alone.graph.node[-1]
    inputs, outputs = operator_graph.search_names()
    assert search.input == [*contract.SEARCH_INPUTS, "", "", "attention_mask"] == list(inputs)
    assert search.output == list(contract.SEARCH_OUTPUTS) == list(outputs)
    assert tuple(alone.graph.node[0].input) == ("input_ids", "pad_id")
    assert alone.graph.node[2].output == [search.input[-1]]  # the mask it reads
    held = {name: {t.name: float(numpy_helper.to_array(t)[0]) for t in graph.initializer}
            for name, graph in subgraphs(search).items()}
    # the encoder's If reads deep_w two scopes down; the decoder keeps its own weight; shared_w,
    # read by both, stays in the main graph (one copy); loop_w went with the Loop
    assert held == {"encoder": {"deep_w": 2.0}, "decoder": {"own_w": 9.0, "decoder_w": 3.0}}
    assert [t.name for t in alone.graph.initializer] == ["pad_id", "shared_w"]
    assert list(subgraphs(search)["decoder"].value_info) == []  # it described an outer weight
    kept = {a.name: a for a in search.attribute if a.type != onnx.AttributeProto.GRAPH}
    before = original.graph.node[1]
    assert kept == {a.name: a for a in before.attribute if a.type != onnx.AttributeProto.GRAPH}
    assert [n.op_type for n in subgraphs(search)["encoder"].node] == ["Add", "If"]
    assert alone.metadata_props == original.metadata_props
    assert (alone.graph.input, alone.graph.output) == (original.graph.input,
                                                       original.graph.output)


@pytest.mark.parametrize("model", [
    exported_like(with_loop=False),  # the fp16 file, files before the Loops: already alone
    exported_like(inputs=("text",), outputs=("translation", "score")),  # a text twin
    b""])
def test_a_file_not_written_so_is_left_as_it_is(model):
    assert operator_graph.operator_only(model) is None
