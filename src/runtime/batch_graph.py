"""A file's search of a batch, without the BeamSearch operator beside it.

Files written by src.export search one sentence with ONNX Runtime's BeamSearch operator and a
batch with ONNX Loops, side by side in the main graph with the weights (`onnx_graph.both_searches`:
ONNX Runtime pre-packs the weights of products only one scope up, so neither search can sit
inside an If). ONNX Runtime runs every node of a graph on every call, so each batch also paid
for one step of the operator on a one-token dummy, run after the Loop with the weights no
longer in cache (docs/engines.md). For batches the runtime opens the same file with that node
cut out and its two outputs made constants: what the Loops' skipped branch would return, never
read when a batch is searched.

The cut is made in the file's bytes (src/runtime/proto_wire.py): the served model has no `onnx`
package, and the subgraphs and weights are copied as they are, never parsed.
"""

from __future__ import annotations

import io
import math
import os

from src.runtime.proto_wire import LENGTH_DELIMITED, field_bytes, key, spans, varint

OPERATOR_OUTPUTS = ("operator_sequences", "operator_scores")  # onnx_graph.both_searches
MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_NODE, GRAPH_INITIALIZER = 1, 5  # GraphProto.node, .initializer
NODE_OUTPUT, NODE_OP_TYPE = 2, 4  # NodeProto.output, .op_type
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_NAME, TENSOR_RAW_DATA = 1, 2, 8, 9  # TensorProto
FLOAT, INT32 = 1, 6  # TensorProto.DataType
# (name, element type, shape): the operator's sequences (B, N, T) and scores (B, N), as
# small as they come; the values are never read
STAND_INS = ((OPERATOR_OUTPUTS[0], INT32, (1, 1, 1)), (OPERATOR_OUTPUTS[1], FLOAT, (1, 1)))


def node_type_outputs(data, span: tuple[int, int]) -> tuple[str, list[str]]:
    """(op_type, outputs) of the NodeProto in data[span]."""
    op_type, outputs = "", []
    for field, wire, value, _ in spans(data, *span):
        if wire != LENGTH_DELIMITED:
            continue
        if field == NODE_OP_TYPE:
            op_type = bytes(data[slice(*value)]).decode()
        elif field == NODE_OUTPUT:
            outputs.append(bytes(data[slice(*value)]).decode())
    return op_type, outputs


def _constant(name: str, element_type: int, shape: tuple[int, ...]) -> bytes:
    """A GraphProto.initializer field: a tensor of zeros."""
    tensor = b"".join(field_bytes(TENSOR_DIMS, dim) for dim in shape)
    tensor += field_bytes(TENSOR_DATA_TYPE, element_type) + field_bytes(TENSOR_NAME, name.encode())
    tensor += field_bytes(TENSOR_RAW_DATA, bytes(4 * math.prod(shape)))  # int32, float: 4 bytes
    return field_bytes(GRAPH_INITIALIZER, tensor)


def without_operator(model: bytes) -> bytes | None:
    """`model` (an ONNX file's bytes) without its main graph's BeamSearch node that writes
    OPERATOR_OUTPUTS, those two values made constants; None for a file without such a node
    beside its Loops (the fp16 file, whose Loops search everything; a file assembled with
    the operator alone, `onnx_graph.assemble(search="operator")`)."""
    return joined(model, pieces_without_operator(model))


def joined(model, pieces: list[tuple[int, int] | bytes] | None) -> bytes | None:
    """A cut's pieces of `model` as one bytes object (None for no cut)."""
    if pieces is None:
        return None
    out = io.BytesIO()
    write_pieces(model, pieces, out)
    return out.getvalue()


def write_pieces(model, pieces: list[tuple[int, int] | bytes], out,
                 chunk: int = 1 << 20, source: int | None = None) -> None:
    """A cut's pieces of `model` (`pieces_without_operator`, or
    `operator_graph.pieces_operator_only`) into the binary file `out`, a range
    `chunk` bytes at a time (a mapped file is never copied whole). `source`: the file
    descriptor `model` is mapped from, whose ranges are then read with `os.pread` rather than
    through the mapping, so that the pages copied never count in this process's memory."""
    pread = getattr(os, "pread", None) if source is not None else None  # none on Windows
    for piece in pieces:
        if isinstance(piece, bytes):
            out.write(piece)
            continue
        for start in range(piece[0], piece[1], chunk):
            size = min(chunk, piece[1] - start)
            out.write(model[start: start + size] if pread is None
                      else pread(source, size, start))


def pieces_without_operator(model) -> list[tuple[int, int] | bytes] | None:
    """`without_operator` as pieces to write one after another: (start, end) ranges of `model`
    (a mapped file: copied piece by piece, never whole) and the few new bytes."""
    graph = next(((value, begin) for field, wire, value, begin in spans(model)
                  if field == MODEL_GRAPH and wire == LENGTH_DELIMITED), None)
    if graph is None:
        return None
    (start, end), graph_begin = graph
    operator, loops = None, 0
    for field, wire, value, begin in spans(model, start, end):
        if field != GRAPH_NODE or wire != LENGTH_DELIMITED:
            continue
        op_type, outputs = node_type_outputs(model, value)
        loops += op_type == "Loop"
        if op_type == "BeamSearch" and tuple(outputs) == OPERATOR_OUTPUTS:
            operator = (begin, value[1])
    if operator is None or not loops:
        return None
    constants = b"".join(_constant(*stand_in) for stand_in in STAND_INS)
    size = (operator[0] - start) + (end - operator[1]) + len(constants)
    header = key(MODEL_GRAPH, LENGTH_DELIMITED) + varint(size)
    return [(0, graph_begin), header, (start, operator[0]), (operator[1], end), constants,
            (end, len(model))]
