"""One self-contained generation graph: encoder, KV-cached decoder and search in a single file.

Two subgraphs exported with `torch.onnx.export`, in ONNX Runtime's newer T5 layout for its
`com.microsoft.BeamSearch` node (model_type=1, encoder-decoder; names and attributes follow
onnxruntime/transformers/convert_generation.py, which we cannot import: it needs transformers):

* encoder subgraph: `encoder_input_ids`, `encoder_attention_mask` (B, S) int32
  -> `present_key_cross_i`, `present_value_cross_i` (B, H, S, d_head) per decoder layer
  (`Transformer.encode` + `Transformer.cross_kv`, its attentions fused as the decoder's);
* decoder subgraph: `input_ids` (B, 1), `encoder_attention_mask`, `past_key_self_i`,
  `past_value_self_i` (B, H, T, d_head), then `past_key_cross_i`, `past_value_cross_i`
  -> `logits` (B, 1, V), `present_key_self_i`, `present_value_self_i` (B, H, T + 1, d_head)
  (`Transformer.decode_step`; the position is T, the length of `past_key_self_0`), its
  attentions fused into com.microsoft.MultiHeadAttention nodes (src/graph/onnx_attention.py).

The CPU files (fp32, int8) search one sentence with the BeamSearch node and a batch with the
same nodes in ONNX Loops that drop finished sentences, one for greedy search and one for beam
search (src/graph/search_loop.py, `both_searches`); the weights are stored once, in the outer
graph. The fp16 file (CUDA) searches every batch, one sentence too, with the Loops: its
encoder and decoder run in float16 and hand the search float32 logits.

The outer graph is what any ONNX Runtime client calls with one `session.run`:

    input_ids            int32 (B, S)  source ids ending with EOS, right-padded with PAD
    max_length           int32 (1,)    generated tokens + 1 (the BOS start token counts)
    min_length           int32 (1,)    same convention; 0 for none
    num_beams            int32 (1,)    1 = greedy (with early_stopping=1 this is exact greedy)
    num_return_sequences int32 (1,)    hypotheses per sentence, 1..num_beams (an n-best list;
                                       more fails the run, as the BeamSearch operator refuses)
    length_penalty       float (1,)    score = sum(log p) / length**length_penalty
    repetition_penalty   float (1,)    1.0 (kept for ORT's signature: the Loop applies none)
    -> sequences         int32 (B, num_return_sequences, T): BOS, tokens, then PAD (no EOS)
    -> sequences_scores  float (B, num_return_sequences): sum(log p) / length**length_penalty,
                         length = the hypothesis's tokens + 1: its EOS, or the limit it was
                         cut at (best first; ONNX Runtime's operator counts the BOS)

The source attention mask is computed inside the graph from `input_ids != PAD`, because ORT's
own mask only handles left padding. PAD, BOS and UNK logits are set to -inf inside the decoder,
as `src.nmt.search` does, so both searches see the same log-probabilities.
Metadata (special ids, languages, limits, tokenizer fingerprints) goes into metadata_props.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn

from src.core.special_ids import BANNED, BOS, EOS, PAD
from src.graph import onnx_attention, row_norm, search_loop
from src.graph.onnx_attention import MS_DOMAIN
from src.nmt.model import Transformer
from src.runtime.batch_graph import OPERATOR_OUTPUTS, STAND_INS
from src.runtime.contract import SCORE_SWITCH, SEARCH_INPUTS, SEARCH_OUTPUTS

IR_VERSION = 10  # onnx.helper.make_model's default (newer) is refused by ONNX Runtime 1.31
SHARE_MIN_ELEMENTS = 1024  # smaller tensors are not worth moving to the outer graph
# the node that fails a batch asked for more hypotheses than beams (ONNX Runtime's message
# names it)
RETURNS_CHECK = "num_return_sequences_above_num_beams"



def cross_names(n_layers: int, prefix: str) -> list[str]:
    return [f"{prefix}_{kv}_cross_{i}" for i in range(n_layers) for kv in ("key", "value")]


def cross_names_of(graph: onnx.GraphProto) -> list[str]:
    """The decoder subgraph's cross-attention inputs (two per layer)."""
    return [v.name for v in graph.input if "_cross_" in v.name]


def self_names(n_layers: int, prefix: str) -> list[str]:
    return [f"{prefix}_{kv}_self_{i}" for i in range(n_layers) for kv in ("key", "value")]


class CrossAttentionKV(nn.Module):
    """Encoder subgraph: source ids and mask -> every decoder layer's cross-attention K/V."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.qkv = nn.ModuleList(onnx_attention.QKV(layer.self_attn) for layer in model.encoder)

    def forward(self, encoder_input_ids: Tensor, encoder_attention_mask: Tensor):
        memory = onnx_attention.encode(self.model, encoder_input_ids.long(),
                                       encoder_attention_mask, self.qkv)
        return tuple(t for kv in self.model.cross_kv(memory) for t in kv)  # 2L x (B, H, S, dh)


def ban_bias(vocab: int) -> Tensor:
    """-inf on the banned ids, as src.nmt.search sets them, so ORT's log-softmax equals
    PyTorch's on the other tokens. It is the output projection's bias (x + 0 = x and
    x - inf = -inf exactly): one Gemm, where a masked_fill over every logit was ~5% of the
    decoder's time in ORT's profile."""
    ban = torch.zeros(vocab)
    ban[list(BANNED)] = float("-inf")
    return ban


class DecoderStep(nn.Module):
    """Decoder subgraph: one token with the self-attention cache -> logits and the grown cache.

    Its attentions are ORT's fused MultiHeadAttention nodes (src/graph/onnx_attention.py)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.register_buffer("ban", ban_bias(model.config.tgt_vocab), persistent=False)
        self.qkv = nn.ModuleList(onnx_attention.QKV(layer.self_attn) for layer in model.decoder)

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, kv: tuple[Tensor, ...]):
        n = len(self.model.decoder)
        past = [(kv[2 * i], kv[2 * i + 1]) for i in range(n)]  # (B, H, T, dh) each
        cross = [(kv[2 * (n + i)], kv[2 * (n + i) + 1]) for i in range(n)]  # (B, H, S, dh)
        hidden, cache = onnx_attention.decode_step_hidden(self.model, input_ids.long(), past,
                                                          cross, encoder_attention_mask, self.qkv)
        logits = F.linear(hidden, self.model.generator.weight, self.ban)  # (B, V)
        return (logits[:, None, :], *(t for kv_pair in cache for t in kv_pair))  # (B, 1, V), ...


@contextlib.contextmanager
def quiet_export():
    """torch.onnx prints progress, warns about torchvision, quantize_dynamic logs advice: hush."""
    names = ("", "torch.onnx", "torch.export", "onnxscript")  # "": quantize_dynamic's root logs
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export_subgraphs(model: Transformer, opset: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The encoder and decoder-step subgraphs of `model` (eval mode, CPU, float32)."""
    model = model.eval().float().cpu()
    n_layers, heads, d_head = len(model.decoder), model.n_heads, model.d_head
    # Example sizes avoid 0 and 1, which torch.export would specialise into constants.
    batch, src_len, past_len = 2, 5, 3
    ids = torch.full((batch, src_len), 4, dtype=torch.int32)
    mask = torch.ones(batch, src_len, dtype=torch.int32)
    b, s, t = torch.export.Dim("batch"), torch.export.Dim("src_len"), torch.export.Dim("past_len")
    with quiet_export(), torch.no_grad():
        encoder = torch.onnx.export(
            CrossAttentionKV(model), (ids, mask), dynamo=True, opset_version=opset,
            custom_translation_table=onnx_attention.TRANSLATIONS,
            input_names=["encoder_input_ids", "encoder_attention_mask"],
            output_names=cross_names(n_layers, "present"),
            dynamic_shapes=({0: b, 1: s}, {0: b, 1: s})).model_proto
        past = [torch.zeros(batch, heads, past_len, d_head) for _ in range(2 * n_layers)]
        cross = [torch.zeros(batch, heads, src_len, d_head) for _ in range(2 * n_layers)]
        tokens = torch.full((batch, 1), BOS, dtype=torch.int32)
        decoder = torch.onnx.export(
            DecoderStep(model), (tokens, mask, (*past, *cross)), dynamo=True,
            opset_version=opset, custom_translation_table=onnx_attention.TRANSLATIONS,
            input_names=["input_ids", "encoder_attention_mask",
                         *self_names(n_layers, "past"), *cross_names(n_layers, "past")],
            output_names=["logits", *self_names(n_layers, "present")],
            dynamic_shapes=({0: b}, {0: b, 1: s},
                            (*({0: b, 2: t} for _ in past), *({0: b, 2: s} for _ in cross)))
        ).model_proto
    for graph in (encoder.graph, decoder.graph):  # readable dim names for the grown cache
        for value in graph.output:
            for dim in value.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim.dim_param.startswith("past_len"):
                    dim.dim_param = "past_len_plus_1"
    return encoder, decoder


def gemm_weights_as_matmul(graph: onnx.GraphProto) -> None:
    """Gemm(x, W, transB=1) with an initializer W -> MatMul(x, W^T stored) (+ Add of C).

    The exporter writes the tied output projection as a Gemm over the (V, D) embedding, which
    suits fp32 (no transposed copy). The dynamic int8 quantizer only makes MatMuls integer: left
    a Gemm, the projection (the largest matrix) stayed fp32 behind a dequantized table (the
    slowest node of the int8 decoder in ORT's profile). Stored transposed, it becomes an integer
    MatMul of its own int8 weights (+ V x D bytes in the int8 file). When the only reader of the
    Gemm unsqueezes it (the (B, V) logits into the (B, 1, V) output), the small input is
    unsqueezed instead, so the fused int8 MatMul + bias writes the output itself (the copy of
    every logit was ~5% of the int8 decoder's time).
    """
    tensors = {t.name: t for t in graph.initializer}
    for node in list(graph.node):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in tensors or attrs.get("transA", 0)
                or not attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0
                or attrs.get("beta", 1.0) != 1.0):
            continue
        weight = numpy_helper.to_array(tensors[node.input[1]])
        transposed = f"{node.input[1]}_transposed"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight.T),
                                                         transposed))
        readers = [n for n in graph.node if node.output[0] in n.input]
        unsqueeze = readers[0] if len(readers) == 1 and readers[0].op_type == "Unsqueeze" \
            and readers[0].input[0] == node.output[0] else None
        source, output, replacement = node.input[0], node.output[0], []
        if unsqueeze is not None:
            source, output = f"{node.input[0]}_unsqueezed", unsqueeze.output[0]
            replacement.append(helper.make_node("Unsqueeze", [node.input[0],
                                                              unsqueeze.input[1]], [source]))
            graph.node.remove(unsqueeze)
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_product" if has_bias else output
        replacement.append(helper.make_node("MatMul", [source, transposed], [product]))
        if has_bias:
            replacement.append(helper.make_node("Add", [product, node.input[2]], [output]))
        position = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new_node in enumerate(replacement):
            graph.node.insert(position + offset, new_node)


def quantize_subgraph(model: onnx.ModelProto, work_dir: Path) -> onnx.ModelProto:
    """Dynamic int8 weights for one subgraph (quantizing the assembled file would skip them).

    Weights are quantized to 7 bits (`reduce_range`, within ±64): on a CPU without VNNI (AVX2,
    AVX-512 without VNNI) ONNX Runtime multiplies uint8 activations by int8 weights with
    VPMADDUBSW, whose sums of two products saturate at 32,767 (255 × 127 × 2 does not fit,
    255 × 64 × 2 does), so 8-bit weights gave wrong products on those CPUs."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work_dir.mkdir(parents=True, exist_ok=True)
    fp32, int8 = work_dir / "fp32.onnx", work_dir / "int8.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())  # work on a copy
    gemm_weights_as_matmul(model.graph)
    onnx.save(model, fp32)
    with quiet_export():
        quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=True)
    quantized = onnx.load(int8)
    fp32.unlink()
    int8.unlink()
    return quantized


def _tensor_key(tensor: TensorProto) -> tuple:
    data = numpy_helper.to_array(tensor)
    return tensor.data_type, tuple(tensor.dims), hashlib.sha256(data.tobytes()).hexdigest()


def _rename_inputs(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]


def share_initializers(encoder: onnx.GraphProto,
                       decoder: onnx.GraphProto) -> list[TensorProto]:
    """Move tensors both subgraphs hold (the tied embedding) to the outer graph, stored once.

    Equal tensors can repeat inside one subgraph too (per-channel int8 zero points of layers
    of the same width are all zeros): every copy on either side reads the one outer tensor."""
    in_decoder: dict[tuple, list[TensorProto]] = {}
    for t in decoder.initializer:
        if int(np.prod(t.dims)) >= SHARE_MIN_ELEMENTS:
            in_decoder.setdefault(_tensor_key(t), []).append(t)
    shared: list[TensorProto] = []
    names: dict[tuple, str] = {}
    encoder_renames: dict[str, str] = {}
    decoder_renames: dict[str, str] = {}
    for tensor in list(encoder.initializer):
        if not tensor.dims or int(np.prod(tensor.dims)) < SHARE_MIN_ELEMENTS:
            continue
        key = _tensor_key(tensor)
        if key not in in_decoder:
            continue
        if key not in names:
            name = names[key] = f"shared_{len(shared)}"
            for match in in_decoder[key]:
                decoder_renames[match.name] = name
                decoder.initializer.remove(match)
            outer = TensorProto()
            outer.CopyFrom(tensor)
            outer.name = name
            shared.append(outer)
            # ORT needs the type of an outer-scope value declared inside each subgraph.
            info = helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
            encoder.value_info.append(info)
            decoder.value_info.append(info)
        encoder_renames[tensor.name] = names[key]
        encoder.initializer.remove(tensor)
    # One pass per subgraph: each pass walks every node input.
    _rename_inputs(encoder, encoder_renames)
    _rename_inputs(decoder, decoder_renames)
    return shared


def untranspose_tied_projection(graph: onnx.GraphProto) -> None:
    """Drop the stored transpose of the tied embedding: MatMul by Transpose(embedding) instead.

    The exporter folds `generator.weight.T` into a second copy of the (V, D) embedding; with a
    Transpose node the file holds the matrix once and ONNX Runtime folds it again at load time.
    """
    def key(array: np.ndarray) -> tuple:
        return array.shape, hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()

    tensors = {t.name: t for t in graph.initializer}
    transposed = {key(numpy_helper.to_array(t).T): t.name for t in graph.initializer
                  if len(t.dims) == 2 and int(np.prod(t.dims)) >= SHARE_MIN_ELEMENTS}
    for node in list(graph.node):
        weight = tensors.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2:
            continue
        original = transposed.get(key(numpy_helper.to_array(weight)))
        if original is None or original == weight.name:
            continue
        node.input[1] = f"{original}_transposed"
        graph.node.insert(0, helper.make_node("Transpose", [original], [node.input[1]],
                                              perm=[1, 0]))
        graph.initializer.remove(weight)


def hoist_initializers(graph: onnx.GraphProto, prefix: str) -> list[TensorProto]:
    """Move every initializer of a subgraph to the outer graph as `prefix + name` (the two
    subgraphs' own names can clash once their nodes share one scope)."""
    moved, renames = [], {}
    for tensor in list(graph.initializer):
        outer = TensorProto()
        outer.CopyFrom(tensor)
        outer.name = renames[tensor.name] = prefix + tensor.name
        moved.append(outer)
        graph.value_info.append(helper.make_tensor_value_info(outer.name, tensor.data_type,
                                                              list(tensor.dims)))
        graph.initializer.remove(tensor)
    _rename_inputs(graph, renames)
    return moved


def source_mask(ids: str, mask: str) -> list[onnx.NodeProto]:
    """mask = int32(ids != PAD): ORT's own mask only handles left padding."""
    return [helper.make_node("Equal", [ids, "pad_id"], [f"{mask}_is_pad"]),
            helper.make_node("Not", [f"{mask}_is_pad"], [f"{mask}_is_token"]),
            helper.make_node("Cast", [f"{mask}_is_token"], [mask], to=TensorProto.INT32)]


def _pick(condition: str, then: str, otherwise: str, out: str) -> onnx.NodeProto:
    """out = then if condition else otherwise, for values of any shape."""
    def branch(name: str, value: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Identity", [value], [f"{out}_{name}"])],
                                 f"{out}_{name}", [], [onnx.ValueInfoProto(name=f"{out}_{name}")])

    return helper.make_node("If", [condition], [out], then_branch=branch("then", then),
                            else_branch=branch("else", otherwise))


def _optional_or(optional: str, default: str, out: str) -> list[onnx.NodeProto]:
    """out = the optional input's value where the caller gave one, else `default`."""
    given = helper.make_graph(
        [helper.make_node("OptionalGetElement", [optional], [f"{out}_given"])],
        f"{out}_given", [], [onnx.ValueInfoProto(name=f"{out}_given")])
    left_out = helper.make_graph(
        [helper.make_node("Identity", [default], [f"{out}_default"])],
        f"{out}_default", [], [onnx.ValueInfoProto(name=f"{out}_default")])
    return [helper.make_node("OptionalHasElement", [optional], [f"{out}_is_given"]),
            helper.make_node("If", [f"{out}_is_given"], [out], then_branch=given,
                             else_branch=left_out)]


def refuse_more_returns_than_beams(returns: str, beams: str, out: str) -> list[onnx.NodeProto]:
    """out = `returns`, or a failed run where it exceeds `beams`, as the BeamSearch operator
    refuses it (the Loops would pad the extra places). ONNX has no assert: a Reshape of the
    one value to two places fails, and ONNX Runtime's message names this node."""
    node = helper.make_node
    return [node("Greater", [returns, beams], [f"{out}_too_many"]),
            node("Cast", [f"{out}_too_many"], [f"{out}_excess"], to=TensorProto.INT64),
            node("Add", [f"{out}_excess", "one_64"], [f"{out}_places"]),
            node("Reshape", [returns, f"{out}_places"], [out],
                 name=RETURNS_CHECK)]


def both_searches(beam_search: onnx.NodeProto | None, encoder: onnx.GraphProto,
                  decoder: onnx.GraphProto, weights: set[str]) -> list[onnx.NodeProto]:
    """ONNX Runtime's BeamSearch for one sentence, shrinking Loops for a batch: a greedy one
    for one beam, a beam one for more (and for n-best lists).

    One sentence has nothing to drop, and the operator's compiled search costs less per step
    than a Loop's ONNX nodes; a batch gains more from dropping finished sentences, and greedy
    search from a body without beam bookkeeping. The BeamSearch node and the Loops sit in the
    outer graph with the weights (ONNX Runtime pre-packs weights only one scope up: inside an
    If, their products ran slower); the ones not chosen run on nothing (a Loop: no step, its
    setup skipped) or on a one-token dummy (BeamSearch: one greedy step).

    `beam_search` None: the Loops search every batch, one sentence too (the fp16 file: the
    operator wants the logits in the past states' float16, the Loops read float32 logits)."""
    node = helper.make_node
    if beam_search is None:  # what a skipped greedy Loop passes on
        nodes = [node("Constant", [], [name], value=helper.make_tensor(
            name, dtype, list(shape), [0] * math.prod(shape)))
            for name, dtype, shape in STAND_INS]
    else:
        nodes = _operator_nodes(beam_search)
    # A batch: the greedy Loop for one beam, the beam Loop for more (and neither for the one
    # sentence the operator searches).
    nodes += [node("Equal", ["num_beams", "one_32"], ["one_beam_1"]),
              node("Squeeze", ["one_beam_1"], ["one_beam"])]
    if beam_search is None:
        nodes.append(node("Not", ["one_beam"], ["many_beams"]))
        skip_greedy, skip_beam = "many_beams", "one_beam"
    else:
        nodes += [node("Or", ["by_operator", "one_beam"], ["skip_beam_loop"]),
                  node("Not", ["one_beam"], ["many_beams"]),
                  node("Or", ["by_operator", "many_beams"], ["skip_greedy_loop"])]
        skip_greedy, skip_beam = "skip_greedy_loop", "skip_beam_loop"
    loop_inputs = {"input_ids": "input_ids", "max_length": "max_length",
                   "min_length": "min_length", "num_beams": "num_beams",
                   "num_return_sequences": "checked_returns",
                   "length_penalty": "length_penalty", "return_scores": "score_switch"}
    nodes += _optional_or(SCORE_SWITCH, "one_32", "score_switch")
    nodes += refuse_more_returns_than_beams("num_return_sequences", "num_beams",
                                            "checked_returns")
    n_layers = len(cross_names_of(decoder)) // 2
    nodes += search_loop.search_nodes(encoder, decoder, n_layers, weights, loop_inputs,
                                      ("greedy_sequences", "greedy_scores"),
                                      skip=skip_greedy,
                                      skipped=OPERATOR_OUTPUTS,
                                      greedy=True)
    nodes += search_loop.search_nodes(encoder, decoder, n_layers, weights, loop_inputs,
                                      SEARCH_OUTPUTS, skip=skip_beam,
                                      skipped=("greedy_sequences", "greedy_scores"))
    return nodes


def _operator_nodes(beam_search: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The BeamSearch node on the batch when it is one sentence, else on a one-token dummy;
    `by_operator` says which."""
    node = helper.make_node
    nodes = [
        node("Shape", ["input_ids"], ["batch_1"], start=0, end=1),
        node("Equal", ["batch_1", "one_64"], ["by_operator_1"]),
        node("Squeeze", ["by_operator_1"], ["by_operator"]),
        _pick("by_operator", "input_ids", "dummy_ids", "operator_ids"),
        node("Where", ["by_operator", "max_length", "two_32"], ["operator_max_length"]),
        node("Where", ["by_operator", "min_length", "zero_32"], ["operator_min_length"]),
        node("Where", ["by_operator", "num_beams", "one_32"], ["operator_num_beams"]),
        node("Where", ["by_operator", "num_return_sequences", "one_32"], ["operator_returns"]),
    ]
    nodes += source_mask("operator_ids", "operator_mask")
    operator = onnx.NodeProto()
    operator.CopyFrom(beam_search)
    renames = {"input_ids": "operator_ids", "max_length": "operator_max_length",
               "min_length": "operator_min_length", "num_beams": "operator_num_beams",
               "num_return_sequences": "operator_returns", "attention_mask": "operator_mask"}
    operator.input[:] = [renames.get(name, name) for name in operator.input]
    operator.output[:] = OPERATOR_OUTPUTS
    nodes.append(operator)
    return nodes


PAD_ID = helper.make_tensor("pad_id", TensorProto.INT32, [], [PAD])  # the operator's mask
LOOP_CONSTANTS = [helper.make_tensor("one_64", TensorProto.INT64, [1], [1]),
                  helper.make_tensor("one_32", TensorProto.INT32, [1], [1])]
# what `_operator_nodes` gives the operator when the batch is not one sentence
PICK_CONSTANTS = [helper.make_tensor("two_32", TensorProto.INT32, [1], [2]),
                  helper.make_tensor("zero_32", TensorProto.INT32, [1], [0]),
                  helper.make_tensor("dummy_ids", TensorProto.INT32, [1, 1], [EOS])]


def assemble(encoder: onnx.ModelProto, decoder: onnx.ModelProto,
             metadata: dict[str, str], search: str = "loop") -> onnx.ModelProto:
    """Encoder + decoder + search in one graph, with the source mask built from PAD.

    search="loop": a batch is searched by ONNX ops around the two subgraphs' nodes, dropping
    finished sentences as it goes (src/graph/search_loop.py), one sentence by ONNX Runtime's
    BeamSearch operator (`both_searches`); "loops": the Loops search one sentence too (the
    fp16 file); "operator": the operator always."""
    encoder, decoder = onnx.ModelProto.FromString(encoder.SerializeToString()), \
        onnx.ModelProto.FromString(decoder.SerializeToString())  # work on copies
    encoder.graph.name, decoder.graph.name = "encoder", "decoder"
    untranspose_tied_projection(decoder.graph)
    shared = share_initializers(encoder.graph, decoder.graph)
    loops = search in ("loop", "loops")
    if loops:  # one copy of the weights in the outer graph, read by both
        shared += hoist_initializers(encoder.graph, "encoder/")
        shared += hoist_initializers(decoder.graph, "decoder/")
    beam_search = helper.make_node(
        "BeamSearch", [*SEARCH_INPUTS, "", "", "attention_mask"], list(SEARCH_OUTPUTS),
        name="BeamSearch", domain=MS_DOMAIN,
        eos_token_id=EOS, pad_token_id=PAD, decoder_start_token_id=BOS,
        no_repeat_ngram_size=0, early_stopping=1, model_type=1,
        encoder=encoder.graph, decoder=decoder.graph)
    # the operator's scores are in the logits' type: float16 in the fp16 file, cast to the
    # contract's float
    score_type = next(o for o in decoder.graph.output
                      if o.name == "logits").type.tensor_type.elem_type
    if loops:
        nodes = both_searches(beam_search if search == "loop" else None, encoder.graph,
                              decoder.graph, {t.name for t in shared})
    else:
        nodes = [*source_mask("input_ids", "attention_mask"), beam_search]
        if score_type != TensorProto.FLOAT:
            beam_search.output[1] = "sequences_scores_as_logits"
            nodes.append(helper.make_node("Cast", ["sequences_scores_as_logits"],
                                          ["sequences_scores"], to=TensorProto.FLOAT))
    scalar = {"length_penalty": TensorProto.FLOAT, "repetition_penalty": TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32,
                                            ["batch_size", "sequence_length"])]
    inputs += [helper.make_tensor_value_info(name, scalar.get(name, TensorProto.INT32), [1])
               for name in SEARCH_INPUTS[1:]]
    # Optional (a caller may leave it out: scores on); the operator's file takes it too, so
    # every file has the same inputs, and ignores it. An input with a default initializer
    # would do the same, but ONNX Runtime warns about one at every load.
    inputs.append(helper.make_value_info(SCORE_SWITCH, helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.INT32, [1]))))
    outputs = [helper.make_tensor_value_info(
        "sequences", TensorProto.INT32, ["batch_size", "num_return_sequences", "max_length"]),
        helper.make_tensor_value_info("sequences_scores", TensorProto.FLOAT,
                                      ["batch_size", "num_return_sequences"])]
    constants = ([PAD_ID] if search != "loops" else []) + (LOOP_CONSTANTS if loops else []) \
        + (PICK_CONSTANTS if search == "loop" else [])
    graph = helper.make_graph(nodes, "nmt generation", inputs, outputs, [*constants, *shared])
    opsets = [o for o in decoder.opset_import if o.domain != MS_DOMAIN]
    opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="nmt-pipeline",
                              ir_version=IR_VERSION)
    helper.set_model_props(model, {k: str(v) for k, v in metadata.items()})
    return model


def beam_search_node(graph: onnx.GraphProto) -> onnx.NodeProto:
    """The BeamSearch node of a file we wrote."""
    return next(node for node in graph.node if node.op_type == "BeamSearch")


def to_fp16(model: onnx.ModelProto, keep_float: tuple[str, ...] = ()) -> onnx.ModelProto:
    """One subgraph in float16, inputs and outputs included but those named in `keep_float`
    (the converter casts them back to float32 at the edge), by ONNX Runtime's own converter."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with quiet_export():
        return convert_float_to_float16(onnx.ModelProto.FromString(model.SerializeToString()),
                                        keep_io_types=list(keep_float) or False)


@dataclass
class Built:
    """The files of one export, as ModelProtos: fp32 always, the others when asked for."""

    fp32: onnx.ModelProto
    int8: onnx.ModelProto | None = None
    fp16: onnx.ModelProto | None = None


def build(model: Transformer, metadata: dict[str, str], opset: int,
          int8_work_dir: Path | None = None, fp16: bool = False) -> Built:
    """The fp32 generation model; given a scratch dir, its int8-weight twin; with `fp16`, its
    float16 twin for GPUs (`weights: fp16`, `runs_on: cuda` in its metadata)."""
    encoder, decoder = export_subgraphs(model, opset)
    cpu_decoder = row_norm.fold_row_norms(decoder)  # its norms on one thread (row_norm.py)
    built = Built(assemble(encoder, cpu_decoder, metadata))
    if int8_work_dir is not None:
        built.int8 = assemble(quantize_subgraph(encoder, int8_work_dir),
                              quantize_subgraph(cpu_decoder, int8_work_dir),
                              {**metadata, "weights": "int8"})
    if fp16:
        # The products, attention, norms and caches in float16; the logits leave the decoder
        # in float32, so the Loops' log-softmax, scores and length penalty are model.onnx's.
        built.fp16 = assemble(to_fp16(encoder), to_fp16(decoder, keep_float=("logits",)),
                              {**metadata, "weights": "fp16", "runs_on": "cuda"},
                              search="loops")
    return built
