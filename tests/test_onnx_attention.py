"""The export's fused-attention decoder step computes what the model's own step computes."""

from __future__ import annotations

import torch

from src.graph import onnx_attention
from src.nmt.model import ModelConfig, Transformer


def test_fused_step_equals_the_models_step_over_a_padded_source():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(50, 50, d_model=32, n_heads=4, n_layers=2, ffn_dim=64,
                                    dropout=0.0, max_positions=32,
                                    share_source_embedding=True)).eval()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])  # second row right-padded
    key_mask = (src != 0).to(torch.int32)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cross = model.cross_kv(memory)
        ours = theirs = model.empty_cache(2)
        for tokens in ([2, 2], [11, 12], [13, 3]):  # three steps, the cache growing
            step = torch.tensor(tokens)[:, None]
            want, theirs = model.decode_step_hidden(step, theirs, cross, src_mask)
            have, ours = onnx_attention.decode_step_hidden(model, step, ours, cross, key_mask)
            torch.testing.assert_close(have, want)
            for (k1, v1), (k2, v2) in zip(ours, theirs):
                torch.testing.assert_close(k1, k2)
                torch.testing.assert_close(v1, v2)
