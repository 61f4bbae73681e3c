"""Validation during training: valid loss, greedy valid BLEU, and the criterion ranking epochs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from src.core import failpoints
from src.core.metrics import bleu as corpus_bleu
from src.data.batching import make_batch, token_batches
from src.data.subword import PAD, Tokenizers
from src.nmt.model import Transformer, matmul_input
from src.nmt.search import translate_ids
from src.training.loss import (
    label_smoothed_cross_entropy,
    projected_cross_entropy,
    rdrop_loss,
)

VALID_BATCH_SIZE = 64


def token_loss(
    model: Transformer, batch, label_smoothing: float, rdrop_alpha: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed label-smoothed loss and summed NLL over non-pad target tokens, and their count.

    Only non-pad positions go through the output projection: the vocabulary matmul is the
    single largest cost, and padding would waste it. With `rdrop_alpha` > 0 the batch goes
    through the model twice in one call (stacked, so each copy draws its own dropout masks)
    and the loss is `rdrop_loss`'s.
    """
    src, tgt_in, keep = batch.src, batch.tgt_in, batch.tgt_out != PAD
    labels = batch.tgt_out[keep]  # (N,)
    if rdrop_alpha:
        src, tgt_in, keep = (torch.cat([t, t]) for t in (src, tgt_in, keep))
    memory, src_mask = model.encode(src)
    hidden = model.decode(tgt_in, memory, src_mask)
    if rdrop_alpha:
        logits = model.generator(hidden[keep])  # (2N, V), bf16 under autocast
        loss, nll = rdrop_loss(logits, labels, label_smoothing, rdrop_alpha)
    elif projects_in_chunks(hidden):
        loss, nll = projected_cross_entropy(matmul_input(hidden[keep]), model.generator.weight,
                                            labels, label_smoothing)
    else:
        logits = model.generator(hidden[keep])  # (N, V)
        loss, nll = label_smoothed_cross_entropy(logits, labels, label_smoothing)
    return loss, nll, len(labels)


def projects_in_chunks(hidden: torch.Tensor) -> bool:
    """Whether the output projection runs inside the loss, in products whose shapes repeat
    from step to step (src/training/loss.py says why): bf16 on the CPU."""
    return hidden.device.type == "cpu" and torch.is_autocast_enabled("cpu")


@torch.no_grad()
def validation_loss(model: Transformer, sources, targets, max_tokens: int, device) -> float:
    model.eval()
    total, count = 0.0, 0
    for idx in token_batches(
        [len(s) for s in sources], [len(t) for t in targets], max_tokens, seed=0, shuffle=False
    ):
        batch = make_batch(
            [sources[i] for i in idx], [targets[i] for i in idx], model.max_positions
        ).to(device)
        _, nll, n = token_loss(model, batch, 0.0)
        total, count = total + float(nll), count + n
    model.train()
    return total / max(count, 1)


@torch.no_grad()
def validation_bleu(
    model: Transformer, sources, targets, tokenizers: Tokenizers, target_lang: str,
    max_length_ratio: float,
) -> float:
    """Greedy corpus BLEU on the valid split (references decoded from their ids); outputs may
    reach `max_length_ratio` x source tokens + 10 (`train.valid_max_length_ratio`)."""
    model.eval()
    hyps = translate_ids(model, sources, 1, 1.0, max_length_ratio, VALID_BATCH_SIZE)
    model.train()
    refs = tokenizers.decode_target([list(t) for t in targets])
    return corpus_bleu(tokenizers.decode_target(hyps), refs, target_lang)


@dataclass
class ValidScorer:
    """Scores the model on the valid split after each epoch.

    `criterion` is what ranks epochs, lower is better: the valid loss, or minus greedy BLEU.
    """

    data: tuple[list, list]
    max_tokens: int
    select_by: str
    tokenizers: Tokenizers | None = None
    target_lang: str = ""
    max_length_ratio: float = 2.0

    def __call__(self, model: Transformer, device) -> dict:
        row = {"valid_loss": validation_loss(model, *self.data, self.max_tokens, device)}
        row["valid_ppl"] = math.exp(min(row["valid_loss"], 50))
        failpoints.hit("during_validation")
        if self.select_by == "bleu":
            row["valid_bleu"] = validation_bleu(model, *self.data, self.tokenizers,
                                                self.target_lang, self.max_length_ratio)
            row["criterion"] = -row["valid_bleu"]
        else:
            row["criterion"] = row["valid_loss"]
        return row
