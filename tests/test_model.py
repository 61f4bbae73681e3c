"""Model pieces against hand-checked values: masks, positions, attention, incremental decoding."""

from __future__ import annotations

import math

import torch

from src.data.subword import PAD
from src.nmt.model import (
    ModelConfig,
    MultiHeadAttention,
    Transformer,
    causal_mask,
    padding_mask,
    sinusoidal_positions,
)


def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[5, 6, PAD], [7, PAD, PAD]])
    mask = padding_mask(ids)
    assert mask.shape == (2, 1, 1, 3)
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]


def test_causal_mask_is_lower_triangular():
    assert causal_mask(3).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]


def test_sinusoidal_positions_hand_values():
    pe = sinusoidal_positions(4, 4)
    # position 0: sin(0)=0, cos(0)=1 on every pair
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    # position 1, i=0: sin(1), cos(1); i=1: frequency 1/10000^(2/4) = 0.01
    expected = [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    assert torch.allclose(pe[1], torch.tensor(expected), atol=1e-6)


def test_attention_matches_plain_softmax_reference():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=8, n_heads=2, dropout=0.0).eval()
    x = torch.randn(2, 3, 8)
    mask = padding_mask(torch.tensor([[4, 5, 6], [4, 5, PAD]]))
    out = attn(x, x, mask)

    def heads(t):
        return t.view(2, 3, 2, 4).transpose(1, 2)

    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(4)
    scores = scores.masked_fill(~mask, float("-inf"))
    ref = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 3, 8)
    ref = attn.out_proj(ref)
    assert torch.allclose(out, ref, atol=1e-5)
    # the padded key of row 2 gets zero weight: changing its value changes nothing
    x2 = x.clone()
    x2[1, 2] = 100.0
    assert torch.allclose(attn(x2, x2, mask)[1, :2], out[1, :2], atol=1e-5)


def tiny_model(pre_norm=True, tie=True, share=True) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(
        50,
        50,
        d_model=16,
        n_heads=2,
        n_layers=2,
        ffn_dim=32,
        dropout=0.0,
        pre_norm=pre_norm,
        max_positions=32,
        tie_embeddings=tie,
        share_source_embedding=share,
    )).eval()


def test_decoder_is_causal():
    model = tiny_model()
    src = torch.tensor([[5, 6, 3]])
    a = model(src, torch.tensor([[2, 7, 8, 9]]))
    b = model(src, torch.tensor([[2, 7, 8, 10]]))  # only the last token differs
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not torch.allclose(a[:, 3], b[:, 3])


def test_incremental_decoding_equals_full_forward():
    for pre_norm in (True, False):
        model = tiny_model(pre_norm=pre_norm)
        src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, PAD]])
        tgt = torch.tensor([[2, 10, 11, 12], [2, 13, 14, 15]])
        full = model(src, tgt)
        memory, src_mask = model.encode(src)
        cross, cache = model.cross_kv(memory), model.empty_cache(2)
        for t in range(tgt.shape[1]):
            logits, cache = model.decode_step(tgt[:, t : t + 1], cache, cross, src_mask)
            assert torch.allclose(logits, full[:, t], atol=1e-5)
        assert cache[0][0].shape == (2, 2, 4, 8)  # (B, H, T, d_head)


def test_tied_embeddings_share_storage():
    model = tiny_model(tie=True, share=True)
    assert model.generator.weight is model.tgt_embed.token.weight
    assert model.src_embed.token.weight is model.tgt_embed.token.weight
    untied = tiny_model(tie=False, share=False)
    assert untied.generator.weight is not untied.tgt_embed.token.weight


def test_source_padding_does_not_change_outputs():
    model = tiny_model()
    tgt = torch.tensor([[2, 7, 8]])
    short = model(torch.tensor([[5, 6, 3]]), tgt)
    padded = model(torch.tensor([[5, 6, 3, PAD, PAD]]), tgt)
    assert torch.allclose(short, padded, atol=1e-5)


def test_decoder_layerdrop_skips_whole_layers_in_training_only():
    import dataclasses

    model = tiny_model()
    model.config = dataclasses.replace(model.config, decoder_layerdrop=0.9999)
    src, tgt = torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7, 8]])
    memory, mask = model.encode(src)
    skipped = model.dec_norm(model.tgt_embed(tgt))  # what no decoder layer at all gives
    model.train()  # dropout is 0: only LayerDrop acts
    hidden = model.decode(tgt, memory, mask)
    assert torch.allclose(hidden, skipped, atol=1e-6)
    hidden.sum().backward()
    grads = [p.grad for p in model.decoder.parameters()]
    assert all(g is not None and not g.any() for g in grads)  # in the graph, zero gradient
    model.eval()
    assert not torch.allclose(model.decode(tgt, memory, mask), skipped, atol=1e-3)
    model.train()
    model.config = dataclasses.replace(model.config, decoder_layerdrop=0.0)
    assert torch.allclose(model.decode(tgt, memory, mask), model.eval().decode(tgt, memory, mask))


def test_decoder_layers_sets_the_decoder_depth_alone(tmp_path):
    """n_layers 2 with decoder_layers 1: two encoder layers, one decoder layer, and the cache and
    cross keys follow the decoder; a config saved before decoder_layers existed still loads."""
    from dataclasses import asdict

    from src.nmt import checkpoint

    model = Transformer(ModelConfig(50, 50, d_model=16, n_heads=2, n_layers=2, ffn_dim=32,
                                    decoder_layers=1)).eval()
    assert (len(model.encoder), len(model.decoder)) == (2, 1)
    memory, _ = model.encode(torch.tensor([[5, 6, 3]]))
    assert len(model.cross_kv(memory)) == len(model.empty_cache(1)) == 1

    equal = tiny_model()
    assert (len(equal.encoder), len(equal.decoder)) == (2, 2)
    old = {"model": equal.state_dict(),
           "config": {k: v for k, v in asdict(equal.config).items() if k != "decoder_layers"}}
    checkpoint.save(old, tmp_path / "old.pt")
    loaded, _ = checkpoint.load_model(tmp_path / "old.pt")
    assert len(loaded.decoder) == 2
