"""The decoder step's pre-norms as InstanceNormalization, their scale and shift folded into the
products that read them.

A decoder step normalizes one row per sentence and beam: (B, 1, D). ONNX Runtime's
LayerNormalization kernel splits its rows over the session's threads whenever there are two or
more, so at beam 4 on two threads each of a step's nine norms handed a few hundred floats to the
other thread and waited for it. InstanceNormalization over the same tensor read as (N=B, C=1, D)
normalizes each row the same way (mean and variance over D, epsilon inside the square root) on
the calling thread. It has no per-feature scale and shift; in a pre-norm layer every reader of a
norm is a product (MatMul by a stored weight, then Add of a stored bias), so they move there:
(n * gamma + beta) W + b = n (diag(gamma) W) + (beta W + b). Norms read by anything else (the
residual stream of a post-norm layer, the final norm before the output projection) stay
LayerNormalization. Measured in docs/engines.md; the CPU files only (the fp16 file is left as
the exporter wrote it).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

UNIT, ZERO = "row_norm_unit", "row_norm_zero"  # InstanceNormalization's scale and shift (C = 1)


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _folding(norm: onnx.NodeProto, readers: dict, tensors: dict) -> list | None:
    """(MatMul, Add, bias name) for each reader of `norm`'s output, or None where one is not
    a product by a stored (D, N) weight followed by only an Add of a stored (N,) bias."""
    found = []
    for product in readers.get(norm.output[0], []):
        if product.op_type != "MatMul" or product.input[0] != norm.output[0] \
                or product.input[1] not in tensors:
            return None
        after = readers.get(product.output[0], [])
        if len(after) != 1 or after[0].op_type != "Add":
            return None
        add = after[0]
        bias = next((name for name in add.input if name != product.output[0]), None)
        weight = tensors[product.input[1]]
        if bias not in tensors or len(weight.dims) != 2 \
                or list(tensors[bias].dims) != [weight.dims[1]]:
            return None
        found.append((product, add, bias))
    return found or None


def fold_row_norms(decoder: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the decoder-step subgraph `decoder` with every LayerNormalization over the
    last axis whose readers are all products (`_folding`) replaced as the module says."""
    decoder = onnx.ModelProto.FromString(decoder.SerializeToString())
    graph = decoder.graph
    tensors = {t.name: t for t in graph.initializer}
    readers = _readers(graph)
    replaced = 0
    for position, norm in enumerate(list(graph.node)):
        attrs = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
        if norm.op_type != "LayerNormalization" or attrs.get("axis", -1) != -1 \
                or len(norm.input) < 3 or not {norm.input[1], norm.input[2]} <= tensors.keys() \
                or any(readers.get(name) for name in norm.output[1:] if name):
            continue
        folding = _folding(norm, readers, tensors)
        if folding is None:
            continue
        gamma = numpy_helper.to_array(tensors[norm.input[1]]).astype(np.float64)
        beta = numpy_helper.to_array(tensors[norm.input[2]]).astype(np.float64)
        for product, add, bias in folding:
            weight = numpy_helper.to_array(tensors[product.input[1]]).astype(np.float64)
            shift = numpy_helper.to_array(tensors[bias]).astype(np.float64) + beta @ weight
            scaled = f"{product.input[1]}_row_normed"
            shifted = f"{bias}_row_normed"
            graph.initializer.extend([
                numpy_helper.from_array((gamma[:, None] * weight).astype(np.float32), scaled),
                numpy_helper.from_array(shift.astype(np.float32), shifted)])
            product.input[1] = scaled
            add.input[list(add.input).index(bias)] = shifted
        graph.node.remove(norm)
        graph.node.insert(position, helper.make_node(
            "InstanceNormalization", [norm.input[0], UNIT, ZERO], list(norm.output[:1]),
            name=f"{norm.name or norm.output[0]}_rows", epsilon=attrs.get("epsilon", 1e-5)))
        replaced += 1
    if replaced:
        graph.initializer.extend([numpy_helper.from_array(np.ones(1, np.float32), UNIT),
                                  numpy_helper.from_array(np.zeros(1, np.float32), ZERO)])
        read = {name for node in graph.node for name in node.input}
        kept = [t for t in graph.initializer if t.name in read]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return decoder
