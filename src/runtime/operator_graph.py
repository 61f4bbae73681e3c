"""A file's search of one sentence: its BeamSearch operator alone, holding its weights.

In the files written by src.export the operator sits beside the batch Loops, and the weights
sit once in the main graph, read by both (`onnx_graph.both_searches`). The operator's encoder
and decoder then read every weight as an outer-scope value, which ONNX Runtime hands to each
subgraph call, once per search step. For one sentence and n-best lists the runtime opens the
file as the operator alone: each weight that only its encoder or only its decoder reads copied
into that subgraph (the tied embedding, read by both, stays outside: one copy), the source mask
before it, the file's inputs, outputs and metadata; the Loops and their switches are left out.
At batch 1 that was up to 15% faster in fp32 and 6-9% in int8, same translations
(docs/engines.md).

Edited in the file's bytes like src/runtime/batch_graph.py (the served model has no `onnx`
package): the weights are copied as they are, never parsed.
"""

from __future__ import annotations

from src.runtime.batch_graph import (
    GRAPH_INITIALIZER,
    GRAPH_NODE,
    MODEL_GRAPH,
    OPERATOR_OUTPUTS,
    joined,
    node_type_outputs,
)
from src.runtime.contract import SEARCH_INPUTS, SEARCH_OUTPUTS
from src.runtime.proto_wire import LENGTH_DELIMITED, field_bytes, key, spans, varint

GRAPH_NAME, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO = 2, 11, 12, 13  # GraphProto
NODE_INPUT, NODE_OUTPUT, NODE_OP_TYPE, NODE_ATTRIBUTE = 1, 2, 4, 5  # NodeProto
ATTR_NAME, ATTR_I, ATTR_G, ATTR_GRAPHS, ATTR_TYPE = 1, 3, 6, 11, 20  # AttributeProto
INT_ATTRIBUTE, INT32 = 2, 6  # AttributeProto.INT, TensorProto.INT32
TENSOR_NAME, VALUE_NAME = 8, 1  # TensorProto.name, ValueInfoProto.name
MASK = "attention_mask"  # BeamSearch's tenth input, after two it is not given
PAD_CONSTANT = "pad_id"  # the main graph's PAD id, read by the source mask


def search_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The operator's inputs (the file's search inputs in BeamSearch's order, then the mask)
    and outputs: the files' contract (src/runtime/contract.py)."""
    return (*SEARCH_INPUTS, "", "", MASK), tuple(SEARCH_OUTPUTS)


def _text(data, span: tuple[int, int]) -> str:
    return bytes(data[slice(*span)]).decode()


def _named(data, span: tuple[int, int], name_field: int) -> str:
    """The name (field `name_field`) of the message in data[span]."""
    return next((_text(data, value) for field, wire, value, _ in spans(data, *span)
                 if field == name_field and wire == LENGTH_DELIMITED), "")


def _whole(data, start: int = 0, end: int | None = None):
    """`spans` with each whole field's range: (field, wire, value, (field start, field end))."""
    end = len(data) if end is None else end
    found = list(spans(data, start, end))
    for i, (field, wire, value, begin) in enumerate(found):
        yield field, wire, value, (begin, found[i + 1][3] if i + 1 < len(found) else end)


def _size(pieces: list) -> int:
    return sum(len(p) if isinstance(p, bytes) else p[1] - p[0] for p in pieces)


def _field(field: int, pieces: list) -> list:
    """A length-delimited field holding `pieces`, as pieces."""
    return [key(field, LENGTH_DELIMITED) + varint(_size(pieces)), *pieces]


def _read_names(data, graph: tuple[int, int], names: set[str]) -> None:
    """Add to `names` every value a node of the graph in data[graph] reads, its subgraphs'
    nodes included."""
    for field, wire, value, _ in spans(data, *graph):
        if field != GRAPH_NODE or wire != LENGTH_DELIMITED:
            continue
        for node_field, node_wire, node_value, _ in spans(data, *value):
            if node_field == NODE_INPUT and node_wire == LENGTH_DELIMITED:
                names.add(_text(data, node_value))
            elif node_field == NODE_ATTRIBUTE and node_wire == LENGTH_DELIMITED:
                for attr_field, attr_wire, attr_value, _ in spans(data, *node_value):
                    if attr_field in (ATTR_G, ATTR_GRAPHS) and attr_wire == LENGTH_DELIMITED:
                        _read_names(data, attr_value, names)


def _reads(data, graph: tuple[int, int]) -> set[str]:
    read: set[str] = set()
    _read_names(data, graph, read)
    return read


def _with_weights(data, graph: tuple[int, int], reads: set[str],
                  weights: dict[str, tuple[int, int]]) -> list:
    """The subgraph in data[graph], which reads `reads`, holding the outer weights in `weights`
    (name -> the outer initializer field's range) that it reads, without the value_info it
    had for them."""
    own = {_named(data, value, TENSOR_NAME) for field, wire, value, _ in spans(data, *graph)
           if field == GRAPH_INITIALIZER and wire == LENGTH_DELIMITED}
    moved = reads & weights.keys() - own
    kept = [whole for field, wire, value, whole in _whole(data, *graph)
            if not (field == GRAPH_VALUE_INFO and wire == LENGTH_DELIMITED
                    and _named(data, value, VALUE_NAME) in moved)]
    return kept + [weights[name] for name in sorted(moved)]


def _operator_node(data, node: tuple[int, int], reads: dict[tuple[int, int], set[str]],
                   weights: dict[str, tuple[int, int]],
                   names: tuple[tuple[str, ...], tuple[str, ...]]) -> list:
    """The operator's NodeProto reading the file's inputs and writing its outputs (`names`:
    `search_names()`), each of its subgraphs (`reads`: what each, by its range, reads) holding
    the `weights` it reads."""
    inputs, outputs = names
    out: list = [b"".join(field_bytes(NODE_INPUT, name.encode()) for name in inputs)
                 + b"".join(field_bytes(NODE_OUTPUT, name.encode()) for name in outputs)]
    for field, wire, value, whole in _whole(data, *node):
        if field in (NODE_INPUT, NODE_OUTPUT):
            continue
        if field != NODE_ATTRIBUTE or wire != LENGTH_DELIMITED:
            out.append(whole)
            continue
        attribute: list = []
        for attr_field, attr_wire, attr_value, attr_whole in _whole(data, *value):
            if attr_field == ATTR_G and attr_wire == LENGTH_DELIMITED:
                attribute += _field(ATTR_G, _with_weights(data, attr_value, reads[attr_value],
                                                          weights))
            else:
                attribute.append(attr_whole)
        out += _field(NODE_ATTRIBUTE, attribute)
    return out


def _simple_node(op_type: str, inputs: list[str], outputs: list[str],
                 cast_to: int | None = None) -> bytes:
    node = b"".join(field_bytes(NODE_INPUT, name.encode()) for name in inputs)
    node += b"".join(field_bytes(NODE_OUTPUT, name.encode()) for name in outputs)
    node += field_bytes(NODE_OP_TYPE, op_type.encode())
    if cast_to is not None:
        node += field_bytes(NODE_ATTRIBUTE, field_bytes(ATTR_NAME, b"to")
                            + field_bytes(ATTR_I, cast_to) + field_bytes(ATTR_TYPE, INT_ATTRIBUTE))
    return field_bytes(GRAPH_NODE, node)


def operator_only(model) -> bytes | None:
    """`model` (an ONNX file's bytes) as its BeamSearch operator alone, see the module's
    docstring; None for a file whose operator already holds its weights (no Loop beside it:
    `onnx_graph.assemble(search="operator")`), that has no such operator (the fp16 file), or
    whose inputs and outputs are not the search's (the text twins)."""
    return joined(model, pieces_operator_only(model))


def pieces_operator_only(model) -> list | None:
    """`operator_only` as pieces to write one after another (`batch_graph.write_pieces`):
    (start, end) ranges of `model` (a mapped file: the weights are copied piece by piece,
    never held whole) and the new bytes between them."""
    graph = next(((value, begin) for field, wire, value, begin in spans(model)
                  if field == MODEL_GRAPH and wire == LENGTH_DELIMITED), None)
    if graph is None:
        return None
    (start, end), _ = graph
    names = search_names()
    operator, loops, weights, kept, ends = None, 0, {}, [], set()
    for field, wire, value, whole in _whole(model, start, end):
        if wire != LENGTH_DELIMITED:
            continue
        if field == GRAPH_NODE:
            op_type, outputs = node_type_outputs(model, value)
            loops += op_type == "Loop"
            if op_type == "BeamSearch" and tuple(outputs) == OPERATOR_OUTPUTS:
                operator = value
        elif field == GRAPH_INITIALIZER:
            weights[_named(model, value, TENSOR_NAME)] = whole
        elif field in (GRAPH_NAME, GRAPH_INPUT, GRAPH_OUTPUT):
            kept.append(whole)
            if field != GRAPH_NAME:
                ends.add(_named(model, value, VALUE_NAME))
    # a text twin (strings in and out around the search) is left as it is
    if operator is None or not loops or PAD_CONSTANT not in weights or \
            not {names[0][0], *names[1]} <= ends:
        return None
    # a weight both subgraphs read (the tied embedding) stays in the main graph, read from
    # there by both: one copy in memory, not two
    reads = {attr_value: _reads(model, attr_value)
             for field, wire, value, _ in spans(model, *operator)
             if field == NODE_ATTRIBUTE and wire == LENGTH_DELIMITED
             for attr_field, attr_wire, attr_value, _ in spans(model, *value)
             if attr_field == ATTR_G and attr_wire == LENGTH_DELIMITED}
    shared = {name for name in weights if sum(name in read for read in reads.values()) > 1}
    alone = {name: whole for name, whole in weights.items() if name not in shared}
    graph_pieces = [*kept, b"".join([
        _simple_node("Equal", [names[0][0], PAD_CONSTANT], [f"{MASK}_is_pad"]),
        _simple_node("Not", [f"{MASK}_is_pad"], [f"{MASK}_is_token"]),
        _simple_node("Cast", [f"{MASK}_is_token"], [MASK], cast_to=INT32)]),
        *_field(GRAPH_NODE, _operator_node(model, operator, reads, alone, names)),
        *[weights[name] for name in sorted(shared | {PAD_CONSTANT})]]
    pieces: list = []
    for field, wire, _, whole in _whole(model):
        if field == MODEL_GRAPH and wire == LENGTH_DELIMITED:
            pieces += _field(MODEL_GRAPH, graph_pieces)
        else:
            pieces.append(whole)
    return pieces
