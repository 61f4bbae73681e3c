"""The exported encoder and decoder step with ONNX Runtime's fused attention (MultiHeadAttention).

Exported from plain PyTorch, one decoder layer's two attentions per step are ~50 ONNX nodes: head
reshapes and transposes, a Concat growing the cache, a transposed copy of every cached key, scale
Muls, the mask's Where, Softmax and batched MatMuls over (batch x heads) tiny matrices. One
MultiHeadAttention node does each attention: it appends to the cache, reads keys untransposed,
masks, and splits the work over (batch x heads) across threads. In ORT's profile those nodes
were ~35% of the int8 decoder's time; with the fused node, beam 4 at batch 32 on 2 threads went
from 238 to 323 sentences/s (fp32) and 421 to 648 (int8), same translations (measured when the
node came in: this file's git log).

Two PyTorch custom ops carry the attention through `torch.onnx.export`: their eager bodies are
the model's own attention math, and `TRANSLATIONS` (the exporter's custom translation table)
maps each to one MultiHeadAttention node. The cache keeps the model's (B, H, T, d_head) layout,
which is the node's BNSH past/present format, so the BeamSearch interface does not change.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnxscript
import torch
import torch.nn.functional as F
from onnx.defs import OpSchema
from torch import Tensor, nn

from src.nmt.model import KV, DecoderLayer, MultiHeadAttention, Transformer

MS_DOMAIN = "com.microsoft"


def _heads(x: Tensor, num_heads: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, num_heads, d // num_heads).transpose(1, 2)  # (B, H, T, d_head)


def _merge(x: Tensor) -> Tensor:
    b, _, t, _ = x.shape
    return x.transpose(1, 2).reshape(b, t, -1)  # (B, T, D)


@torch.library.custom_op("nmt::cached_self_attention", mutates_args=())
def cached_self_attention(query: Tensor, key: Tensor, value: Tensor, past_key: Tensor,
                          past_value: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """New positions (B, T, D) attend over the cache plus themselves (no mask: a step sees all
    of its past) -> (output (B, T, D), grown keys, grown values (B, H, P + T, d_head))."""
    keys = torch.cat([past_key, _heads(key, num_heads)], dim=2)
    values = torch.cat([past_value, _heads(value, num_heads)], dim=2)
    out = F.scaled_dot_product_attention(_heads(query, num_heads), keys, values)
    return _merge(out), keys, values


@cached_self_attention.register_fake
def _(query, key, value, past_key, past_value, num_heads):
    grown = (*past_key.shape[:2], past_key.shape[2] + key.shape[1], past_key.shape[3])
    return query.new_empty(query.shape), past_key.new_empty(grown), past_value.new_empty(grown)


@torch.library.custom_op("nmt::cross_attention", mutates_args=())
def cross_attention(query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor,
                    num_heads: int) -> Tensor:
    """Queries (B, T, D) over the encoder's keys/values (B, H, S, d_head); key_mask (B, S) int,
    non-zero = a source token -> (B, T, D)."""
    mask = (key_mask != 0)[:, None, None, :]
    return _merge(F.scaled_dot_product_attention(_heads(query, num_heads), key, value,
                                                 attn_mask=mask))


@cross_attention.register_fake
def _(query, key, value, key_mask, num_heads):
    return query.new_empty(query.shape)


@torch.library.custom_op("nmt::padded_self_attention", mutates_args=())
def padded_self_attention(query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor,
                          num_heads: int) -> Tensor:
    """The encoder's attention: queries, keys, values (B, S, D); key_mask (B, S) int, non-zero
    = a source token -> (B, S, D)."""
    return cross_attention(query, _heads(key, num_heads), _heads(value, num_heads), key_mask,
                           num_heads)


@padded_self_attention.register_fake
def _(query, key, value, key_mask, num_heads):
    return query.new_empty(query.shape)


def _schema(outputs: int) -> OpSchema:
    """The node's signature (ORT registers it, the onnx package does not; onnxscript needs it
    to build the node). `outputs` = 1 (output) or 3 (output, present_key, present_value)."""
    param, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    inputs = [param("query", "T")] + [
        param(name, "M" if name == "key_padding_mask" else "T", param_option=optional)
        for name in ("key", "value", "bias", "key_padding_mask", "attention_bias",
                     "past_key", "past_value")]
    return OpSchema(
        "MultiHeadAttention", MS_DOMAIN, 1,
        inputs=inputs,
        outputs=[param(name, "T") for name in ("output", "present_key", "present_value")][
            :outputs],
        type_constraints=[("T", ["tensor(float)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "")])


_MS_OPSET = onnxscript.values.Opset(MS_DOMAIN, 1)
_ATTENTION = onnxscript.values.Op(_MS_OPSET, "MultiHeadAttention", _schema(1))
_CACHED_ATTENTION = onnxscript.values.Op(_MS_OPSET, "MultiHeadAttention", _schema(3))


def _cached_self_attention_onnx(query, key, value, past_key, past_value, num_heads: int):
    return _CACHED_ATTENTION(query, key, value, None, None, None, past_key, past_value,
                             num_heads=num_heads)


def _cross_attention_onnx(query, key, value, key_mask, num_heads: int):
    return _ATTENTION(query, key, value, None, key_mask, num_heads=num_heads)


TRANSLATIONS = {
    torch.ops.nmt.cached_self_attention.default: _cached_self_attention_onnx,
    torch.ops.nmt.cross_attention.default: _cross_attention_onnx,
    # MultiHeadAttention takes keys and values as (B, S, D) too: the same node.
    torch.ops.nmt.padded_self_attention.default: _cross_attention_onnx,
}


class QKV(nn.Module):
    """One self-attention's query, key and value projections as one stored (3D, D) matrix:
    one int8 MatMul of three times the width, one node instead of three, in the exported
    graph. Stored (a buffer), not concatenated in forward: the quantizer only quantizes
    products of stored weights."""

    def __init__(self, attn: MultiHeadAttention):
        super().__init__()
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.register_buffer("weight", torch.cat([p.weight for p in projections]).detach())
        self.register_buffer("bias", torch.cat([p.bias for p in projections]).detach())

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = F.linear(h, self.weight, self.bias).chunk(3, dim=-1)
        return q, k, v


def encode(model: Transformer, src: Tensor, key_mask: Tensor,
           qkv: Sequence[QKV] | None = None) -> Tensor:
    """`Transformer.encode` with the fused attention: src (B, S) ids, key_mask (B, S) int ->
    memory (B, S, D); `qkv`: the encoder layers' fused projections (built when not given).
    Each attention is one node, as in the decoder, instead of the exporter's chain of head
    reshapes, batched MatMuls over (batch x heads) tiny matrices, mask and softmax."""
    qkv = qkv if qkv is not None else [QKV(layer.self_attn) for layer in model.encoder]
    x = model.src_embed(src)
    for layer, fused in zip(model.encoder, qkv):
        attn = layer.self_attn

        def attend(h: Tensor, attn=attn, fused=fused) -> Tensor:
            return attn.out_proj(padded_self_attention(*fused(h), key_mask, model.n_heads))

        x = layer.res_ffn(layer.res_attn(x, attend), layer.ffn)
    return model.enc_norm(x)


def _layer_step(layer: DecoderLayer, qkv: QKV, y: Tensor, past: KV, cross: KV,
                key_mask: Tensor, num_heads: int) -> tuple[Tensor, KV]:
    """`DecoderLayer.step` with the two custom ops (same sublayers, same order)."""
    grown: list[Tensor] = []

    def self_block(h: Tensor) -> Tensor:
        attn = layer.self_attn
        out, keys, values = cached_self_attention(*qkv(h), past[0], past[1], num_heads)
        grown.extend((keys, values))
        return attn.out_proj(out)

    def cross_block(h: Tensor) -> Tensor:
        attn = layer.cross_attn
        return attn.out_proj(cross_attention(attn.q_proj(h), cross[0], cross[1], key_mask,
                                             num_heads))

    y = layer.res_self(y, self_block)
    y = layer.res_cross(y, cross_block)
    return layer.res_ffn(y, layer.ffn), (grown[0], grown[1])


def decode_step_hidden(model: Transformer, tokens: Tensor, cache: list[KV], cross: list[KV],
                       key_mask: Tensor, qkv: Sequence[QKV] | None = None
                       ) -> tuple[Tensor, list[KV]]:
    """`Transformer.decode_step_hidden` through the custom ops; key_mask (B, S) int; `qkv`:
    the decoder layers' fused projections (built from the model when not given).

    It mirrors the model's own step rather than replacing it, so training and `src.nmt.search`
    never depend on these ops; export's parity check (ORT vs `src.nmt.search`) and
    tests/test_export.py compare the two."""
    position = cache[0][0].shape[2]
    y = model.tgt_embed(tokens, offset=position)
    qkv = qkv if qkv is not None else [QKV(layer.self_attn) for layer in model.decoder]
    grown = []
    for layer, fused, past, kv in zip(model.decoder, qkv, cache, cross):
        y, present = _layer_step(layer, fused, y, past, kv, key_mask, model.n_heads)
        grown.append(present)
    return model.dec_norm(y[:, -1]), grown
