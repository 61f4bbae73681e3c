"""The scoring file: how likely the model finds a given translation of a given source.

`models/model.score.onnx` runs the encoder and the whole decoder once over the given target
(teacher forcing, no search) and returns each target token's log-probability, as CTranslate2's
`score_batch`, fairseq's `--score-reference` and Marian's scorer do:

    source_ids      int32 (B, S)   source ids ending with EOS, right-padded with PAD
    target_ids      int32 (B, T)   target ids ending with EOS, right-padded with PAD
    -> token_logprobs float (B, T)  log p(target token | source, the tokens before it); 0 at PAD

PAD, BOS and UNK get -inf logits before the log-softmax, as in the search, so a target's
log-probability here is the one the search would give it. `src.score` runs it without torch.
"""

from __future__ import annotations

import onnx
import torch
import torch.nn.functional as F
from onnx import helper
from torch import Tensor, nn

from src.core.special_ids import BOS, PAD
from src.graph.onnx_graph import IR_VERSION, ban_bias, quiet_export
from src.nmt.model import Transformer
from src.runtime.likelihood import SCORE_FORMAT, SCORE_INPUTS, SCORE_OUTPUT


class ForcedScore(nn.Module):
    """Token log-probabilities of `target_ids` given `source_ids` (teacher forcing)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.register_buffer("ban", ban_bias(model.config.tgt_vocab), persistent=False)

    def forward(self, source_ids: Tensor, target_ids: Tensor) -> Tensor:
        target = target_ids.long()
        tgt_in = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], dim=1)
        memory, src_mask = self.model.encode(source_ids.long())
        hidden = self.model.decode(tgt_in, memory, src_mask)
        logits = F.linear(hidden, self.model.generator.weight, self.ban)  # (B, T, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return picked.masked_fill(target == PAD, 0.0)


def token_logprobs(model: Transformer, source_ids: Tensor, target_ids: Tensor) -> Tensor:
    """PyTorch's answer for the same inputs (the reference export checks the file against)."""
    with torch.no_grad():
        return ForcedScore(model.eval())(source_ids, target_ids)


def export_scorer(model: Transformer, opset: int, metadata: dict[str, str]) -> onnx.ModelProto:
    """The scoring graph of `model` (eval mode, CPU, float32) with `metadata`."""
    model = model.eval().float().cpu()
    # Example sizes avoid 0 and 1, which torch.export would specialise into constants.
    source = torch.full((2, 5), 4, dtype=torch.int32)
    target = torch.full((2, 4), 5, dtype=torch.int32)
    b, s, t = torch.export.Dim("batch"), torch.export.Dim("src_len"), torch.export.Dim("tgt_len")
    with quiet_export(), torch.no_grad():
        proto = torch.onnx.export(
            ForcedScore(model), (source, target), dynamo=True, opset_version=opset,
            input_names=list(SCORE_INPUTS), output_names=[SCORE_OUTPUT],
            dynamic_shapes=({0: b, 1: s}, {0: b, 1: t})).model_proto
    proto.ir_version = min(proto.ir_version, IR_VERSION)
    helper.set_model_props(proto, {**{k: str(v) for k, v in metadata.items()},
                                   "format": SCORE_FORMAT})
    return proto
