"""The CPU decoder step's pre-norms as InstanceNormalization with their scale and shift folded
into the products (src/graph/row_norm.py): the same numbers, and only where it holds."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest
import torch

from src.graph import onnx_graph, row_norm
from src.nmt.model import ModelConfig, Transformer

pytestmark = pytest.mark.slow  # each test reads a toy decoder exported to ONNX (seconds each)


def toy(pre_norm: bool) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(60, 60, d_model=32, n_heads=4, n_layers=2, ffn_dim=64,
                                    dropout=0.0, max_positions=32, pre_norm=pre_norm,
                                    share_source_embedding=True)).eval()
    with torch.no_grad():  # norms that are not the identity, so folding them shows
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


@functools.cache
def exported_decoder(pre_norm: bool):
    """The toy's decoder step as ONNX, exported once per run (seconds each); tests copy what
    they change (`fold_row_norms` leaves its input as it was, as a test checks)."""
    return onnx_graph.export_subgraphs(toy(pre_norm=pre_norm), 18)[1]


def ops(model) -> list[str]:
    return [node.op_type for node in model.graph.node]


def step_outputs(decoder, rows: int, threads: int) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(decoder.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(4, 60, (rows, 1)).astype(np.int32),
             "encoder_attention_mask": np.array([[1] * 5 + [0] * (i % 2) + [1] * (1 - i % 2)
                                                 for i in range(rows)], np.int32)}
    for value in session.get_inputs()[2:]:
        length = 3 if "self" in value.name else 6
        feeds[value.name] = rng.standard_normal((rows, 4, length, 8)).astype(np.float32)
    return session.run(None, feeds)


@pytest.mark.parametrize("rows, threads", [(1, 1), (4, 2)])
def test_a_pre_norm_step_normalizes_rows_without_layer_norms_and_computes_the_same(rows,
                                                                                  threads):
    decoder = exported_decoder(pre_norm=True)
    folded = row_norm.fold_row_norms(decoder)
    # two layers x three sublayers; the final norm feeds the output projection and stays
    assert ops(folded).count("InstanceNormalization") == 6
    assert ops(folded).count("LayerNormalization") == 1
    assert ops(decoder).count("LayerNormalization") == 7  # the original is left as it was
    want, have = step_outputs(decoder, rows, threads), step_outputs(folded, rows, threads)
    logits = np.isfinite(want[0])
    assert (np.isfinite(have[0]) == logits).all()
    np.testing.assert_allclose(have[0][logits], want[0][logits], rtol=1e-4, atol=1e-4)
    for grown_want, grown_have in zip(want[1:], have[1:]):  # the caches the search carries
        np.testing.assert_allclose(grown_have, grown_want, rtol=1e-4, atol=1e-5)


def test_a_post_norm_step_keeps_its_layer_norms():
    """Post-norm: each norm's output is the residual stream too, read by an Add, not only by
    products: nothing to fold into."""
    decoder = exported_decoder(pre_norm=False)
    folded = row_norm.fold_row_norms(decoder)
    assert "InstanceNormalization" not in ops(folded)
    assert ops(folded) == ops(decoder)
