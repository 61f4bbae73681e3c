"""src/nmt/dropout.py: the CPU dropout keeps nn.Dropout's contract, drawing masks 4 at a time."""

import pytest
import torch
from torch import nn

from src.nmt.dropout import LEVELS, Dropout, dropout
from src.nmt.model import ModelConfig, Transformer


def test_drops_the_asked_share_and_scales_the_rest_to_keep_the_mean():
    torch.manual_seed(0)
    x = torch.ones(2_000_000)
    y = dropout(x, 0.2)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(0.2, abs=0.002)  # binomial sd here is 0.0003
    kept = y[y != 0]
    assert torch.all(kept == LEVELS / (LEVELS - round(0.2 * LEVELS)))
    assert y.mean().item() == pytest.approx(1.0, abs=0.003)


def test_every_16_bit_lane_of_a_draw_is_unbiased():
    # Each 64-bit draw feeds 4 consecutive elements; a draw without the top bit would never
    # drop the 4th element of each group at p = 0.5.
    torch.manual_seed(1)
    y = dropout(torch.ones(400_000), 0.5).view(-1, 4)
    for rate in (y == 0).float().mean(dim=0).tolist():
        assert rate == pytest.approx(0.5, abs=0.01)


def test_masks_repeat_under_a_seed_and_differ_across_seeds():
    x = torch.randn(64, 33)  # numel not a multiple of 4
    torch.manual_seed(3)
    first = dropout(x, 0.3)
    torch.manual_seed(3)
    again = dropout(x, 0.3)
    torch.manual_seed(4)
    other = dropout(x, 0.3)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert first.shape == x.shape


def test_gradient_flows_through_kept_elements_only():
    torch.manual_seed(5)
    x = torch.ones(1000, requires_grad=True)
    y = dropout(x, 0.25)
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(x * mask * scale)/dx at x = 1 is the output


def test_eval_mode_and_p_zero_are_the_identity_and_p_one_zeroes():
    x = torch.randn(10, 7)
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert Dropout(0.0).train()(x) is x
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    with pytest.raises(ValueError):
        Dropout(1.5)


def test_the_transformer_uses_it_for_every_dropout():
    # nn.Dropout on CPU costs ~17% of the training throughput of the default recipe.
    model = Transformer(ModelConfig(src_vocab=50, tgt_vocab=50, d_model=16, n_heads=2,
                                          n_layers=2, ffn_dim=32, dropout=0.1))
    assert not [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert sum(isinstance(m, Dropout) for m in model.modules()) > 0
