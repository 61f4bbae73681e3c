"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), encoder–decoder.

Scaled embeddings + sinusoidal positions, multi-head attention through
`F.scaled_dot_product_attention`, padding masks on both sides, causal decoder self-attention,
position-wise FFN, residual + LayerNorm (pre-LN by default, post-LN as in the paper),
dropout, and tied target embedding / output projection.

Incremental decoding: `encode` runs the encoder once, `cross_kv` projects its output into the
per-layer cross-attention keys/values once, and `decode_step` advances one token with a
self-attention key/value cache. The ONNX export mirrors these three methods one-to-one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from src.core.special_ids import PAD
from src.nmt.dropout import Dropout, dropout
from src.nmt.packing import PackedRows

KV = tuple[Tensor, Tensor]  # (keys, values), each (B, H, T, d_head)


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same) (paper §3.5)."""
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * inv_freq)
    pe[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return pe


def causal_mask(length: int, device=None) -> Tensor:
    """(T, T) bool, True where query t may attend to key s (s <= t)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def padding_mask(ids: Tensor) -> Tensor:
    """(B, T) ids -> (B, 1, 1, T) bool, True on real tokens (broadcasts over heads, queries)."""
    return (ids != PAD)[:, None, None, :]


def matmul_input(x: Tensor) -> Tensor:
    """x in autocast's low precision while autocast is on, else x itself. Cast once where a
    LayerNorm output or the encoder memory leaves fp32, rather than by every linear reading it
    (q, k and v would each cast the same tensor); the linears' inputs are the same bits."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


class Embeddings(nn.Module):
    """Token embedding * sqrt(d_model) + sinusoidal position, then dropout."""

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, dropout: float):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        nn.init.normal_(self.token.weight, std=d_model**-0.5)  # so scaled embeddings have unit std
        self.scale = math.sqrt(d_model)
        self.register_buffer("pe", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int | Tensor = 0, packing: PackedRows | None = None
                ) -> Tensor:
        if packing is not None:  # (rows, D): the real tokens only
            ids = ids.reshape(-1).index_select(0, packing.rows)
            return self.dropout(self.token(ids) * self.scale + self.pe[packing.pe_rows()], packing)
        length = ids.shape[1]
        return self.dropout(self.token(ids) * self.scale + self.pe[offset : offset + length])


def attention_with_dropout(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float
                           ) -> Tensor:
    """softmax(q k^T / sqrt(d_head)) with dropout on the weights, times v (paper eq. 1).

    What `F.scaled_dot_product_attention(dropout_p=p)` computes, written out for training: with
    dropout, SDPA on CPU takes its reference path, which copies q, k and v to fp32 under bf16
    autocast and draws the mask with `bernoulli_`. Here the products stay in autocast's
    precision, the softmax runs in fp32, and the mask is `dropout`'s cheaper one.
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = dropout(torch.softmax(scores, dim=-1, dtype=torch.float32), p)
    return torch.matmul(weights.to(v.dtype), v)  # (B, H, Tq, d_head)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)

    def project_kv(self, x: Tensor, packing: PackedRows | None = None) -> KV:
        k, v = self.k_proj(x), self.v_proj(x)
        if packing is not None:
            k, v = packing.unpack(k), packing.unpack(v)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, x: Tensor, kv: KV, mask: Tensor | None, packing: PackedRows | None = None
               ) -> Tensor:
        """Queries from x (B, Tq, D), or its packed rows, over keys/values (B, H, Tk, d_head);
        mask True = attend."""
        q = self.q_proj(x)
        q = self.split_heads(q if packing is None else packing.unpack(q))
        k, v = kv
        if self.training and self.dropout > 0:
            out = attention_with_dropout(q, k, v, mask, self.dropout)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, -1)  # (B, Tq, D)
        return self.out_proj(out if packing is None else packing.pack(out))

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None,
                packing: PackedRows | None = None, memory_packing: PackedRows | None = None
                ) -> Tensor:
        return self.attend(x, self.project_kv(memory, memory_packing), mask, packing)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (paper eq. 2)."""

    def __init__(self, d_model: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, ffn_dim),
            nn.ReLU(),
            Dropout(dropout),
            nn.Linear(ffn_dim, d_model),
        )

    def forward(self, x: Tensor, packing: PackedRows | None = None) -> Tensor:
        up, relu, drop, down = self.net
        return down(drop(relu(up(x)), packing))


class Residual(nn.Module):
    """x + Dropout(f(LN(x))) when pre-LN; LN(x + Dropout(f(x))) when post-LN (the paper's)."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer, packing: PackedRows | None = None) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(matmul_input(self.norm(x))), packing)
        return self.norm(x + self.dropout(sublayer(matmul_input(x)), packing))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, ffn_dim, dropout, pre_norm):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.res_attn = Residual(d_model, dropout, pre_norm)
        self.res_ffn = Residual(d_model, dropout, pre_norm)

    def forward(self, x: Tensor, src_mask: Tensor, packing: PackedRows | None = None) -> Tensor:
        x = self.res_attn(x, lambda h: self.self_attn(h, h, src_mask, packing, packing), packing)
        return self.res_ffn(x, lambda h: self.ffn(h, packing), packing)


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, ffn_dim, dropout, pre_norm):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.res_self = Residual(d_model, dropout, pre_norm)
        self.res_cross = Residual(d_model, dropout, pre_norm)
        self.res_ffn = Residual(d_model, dropout, pre_norm)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor,
                packing: PackedRows | None = None, memory_packing: PackedRows | None = None
                ) -> Tensor:
        y = self.res_self(y, lambda h: self.self_attn(h, h, tgt_mask, packing, packing), packing)
        y = self.res_cross(y, lambda h: self.cross_attn(h, memory, src_mask, packing,
                                                        memory_packing), packing)
        return self.res_ffn(y, lambda h: self.ffn(h, packing), packing)

    def step(self, y: Tensor, past: KV, cross: KV, src_mask: Tensor) -> tuple[Tensor, KV]:
        """One new position y (B, 1, D): self-attend over cache + itself, no mask needed."""
        new: KV = (past[0], past[1])

        def self_block(h: Tensor) -> Tensor:
            nonlocal new
            k, v = self.self_attn.project_kv(h)
            new = (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
            return self.self_attn.attend(h, new, None)

        y = self.res_self(y, self_block)
        y = self.res_cross(y, lambda h: self.cross_attn.attend(h, cross, src_mask))
        return self.res_ffn(y, self.ffn), new


@dataclass(frozen=True)
class ModelConfig:
    """Everything that shapes the network; saved as a dict in every checkpoint."""

    src_vocab: int
    tgt_vocab: int
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 3  # encoder layers, and decoder layers unless decoder_layers is set
    ffn_dim: int = 1024
    dropout: float = 0.1
    pre_norm: bool = True
    max_positions: int = 256
    tie_embeddings: bool = True  # output projection = target embedding
    share_source_embedding: bool = False  # source embedding too (one shared vocabulary)
    decoder_layerdrop: float = 0.0  # training only: skip each decoder layer with this chance
    # Last, with a default, so checkpoints written before it existed still load (as n_layers).
    decoder_layers: int = 0  # 0: as many as n_layers

    @property
    def n_decoder_layers(self) -> int:
        return self.decoder_layers or self.n_layers


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        layer_args = (c.d_model, c.n_heads, c.ffn_dim, c.dropout, c.pre_norm)
        self.src_embed = Embeddings(c.src_vocab, c.d_model, c.max_positions, c.dropout)
        self.tgt_embed = Embeddings(c.tgt_vocab, c.d_model, c.max_positions, c.dropout)
        if c.share_source_embedding:  # one vocabulary for both sides: one embedding matrix
            self.src_embed.token.weight = self.tgt_embed.token.weight
        self.encoder = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(c.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(c.n_decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        self.enc_norm = nn.LayerNorm(c.d_model) if c.pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(c.d_model) if c.pre_norm else nn.Identity()
        self.generator = nn.Linear(c.d_model, c.tgt_vocab, bias=False)
        if c.tie_embeddings:  # paper §3.4: output projection shares the target embedding
            self.generator.weight = self.tgt_embed.token.weight
        self.n_heads, self.d_head = c.n_heads, c.d_model // c.n_heads
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name and "generator" not in name:
                nn.init.xavier_uniform_(p)

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    def packs_rows(self, device: torch.device) -> bool:
        """Whether encode and decode run on the real tokens' rows (`PackedRows`): training in
        bf16 on the CPU, where oneDNN's per-shape kernels need the rows bucketed anyway."""
        return self.training and device.type == "cpu" and torch.is_autocast_enabled("cpu")

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids -> memory (B, S, D) and its padding mask (B, 1, 1, S)."""
        src_mask = padding_mask(src)
        packing = PackedRows(src_mask[:, 0, 0]) if self.packs_rows(src.device) else None
        x = self.src_embed(src, packing=packing)
        for layer in self.encoder:
            x = layer(x, src_mask, packing)
        x = self.enc_norm(x)
        return (x if packing is None else packing.unpack(x)), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher forcing: tgt_in (B, T) -> hidden states (B, T, D)."""
        t = tgt_in.shape[1]
        real = tgt_in != PAD
        tgt_mask = real[:, None, None, :] & causal_mask(t, tgt_in.device)  # (B, 1, T, T)
        packing = memory_packing = None
        if self.packs_rows(tgt_in.device):
            packing, memory_packing = PackedRows(real), PackedRows(src_mask[:, 0, 0])
        y = self.tgt_embed(tgt_in, packing=packing)
        memory = matmul_input(memory)  # read by every layer's cross-attention keys and values
        if memory_packing is not None:
            memory = memory_packing.pack(memory)
        for layer in self.decoder:
            out = layer(y, memory, src_mask, tgt_mask, packing, memory_packing)
            if self.training and self.config.decoder_layerdrop > 0:
                # LayerDrop (Fan, Grave & Joulin, ICLR 2020): the whole batch skips the layer.
                # Computed and multiplied away rather than skipped, so every parameter stays in
                # the graph (DDP expects a gradient for each, if only a zero).
                keep = (torch.rand((), device=y.device) >= self.config.decoder_layerdrop)
                out = y + keep.to(y.dtype) * (out - y)
            y = out
        y = self.dec_norm(y)
        return y if packing is None else packing.unpack(y)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, V) for every target position."""
        memory, src_mask = self.encode(src)
        return self.generator(self.decode(tgt_in, memory, src_mask))

    def cross_kv(self, memory: Tensor) -> list[KV]:
        """Per decoder layer, cross-attention keys/values of the encoder output (computed once)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder]

    def empty_cache(self, batch: int, device=None, dtype=torch.float32) -> list[KV]:
        shape = (batch, self.n_heads, 0, self.d_head)
        return [
            (
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
            )
            for _ in self.decoder
        ]

    def decode_step(
        self, tokens: Tensor, cache: list[KV], cross: list[KV], src_mask: Tensor
    ) -> tuple[Tensor, list[KV]]:
        """tokens (B, 1) at position len(cache) -> next-token logits (B, V) and the grown cache."""
        hidden, new_cache = self.decode_step_hidden(tokens, cache, cross, src_mask)
        return self.generator(hidden), new_cache

    def decode_step_hidden(
        self, tokens: Tensor, cache: list[KV], cross: list[KV], src_mask: Tensor
    ) -> tuple[Tensor, list[KV]]:
        """`decode_step` up to the output projection: the normalised state (B, D)."""
        position = cache[0][0].shape[2]
        y = self.tgt_embed(tokens, offset=position)
        new_cache = []
        for layer, past, kv in zip(self.decoder, cache, cross):
            y, present = layer.step(y, past, kv, src_mask)
            new_cache.append(present)
        return self.dec_norm(y[:, -1]), new_cache


def model_config(params, src_vocab: int, tgt_vocab: int, shared_vocab: bool) -> ModelConfig:
    """The network described by params.yaml's `model` section and the tokenizer's vocabularies."""
    return ModelConfig(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        d_model=params.d_model,
        n_heads=params.n_heads,
        n_layers=params.n_layers,
        ffn_dim=params.ffn_dim,
        dropout=params.dropout,
        pre_norm=params.pre_norm,
        max_positions=params.max_positions,
        tie_embeddings=params.tie_embeddings,
        share_source_embedding=params.tie_embeddings and shared_vocab,
        decoder_layerdrop=params.decoder_layerdrop,
        decoder_layers=params.decoder_layers,
    )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
