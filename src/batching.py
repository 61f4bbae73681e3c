"""Token-count batches from length buckets, and padding them into tensors.

Examples are shuffled, cut into pools of ~100 batches, sorted by length inside each pool (so a
batch holds sentences of similar length and little padding), packed greedily until
batch_size * (longest source + longest target) would exceed `max_tokens`, and the batch order
is shuffled again. Everything depends only on (seed, epoch), so a resumed run sees the same
batches in the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from src.subword import BOS, EOS, PAD

POOL_BATCHES = 100


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, right-padded with PAD
    tgt_in: Tensor  # (B, T) BOS + target ids
    tgt_out: Tensor  # (B, T) target ids + EOS (the labels)

    @property
    def n_tokens(self) -> int:
        """Non-pad source + target tokens (what tokens/s counts)."""
        return int((self.src != PAD).sum() + (self.tgt_out != PAD).sum())

    def to(self, device) -> Batch:
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device))


def clip_source(ids: list[int], max_positions: int) -> list[int]:
    return list(ids[: max_positions - 1]) + [EOS]


def pad(rows: list[list[int]]) -> Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def make_batch(sources: list[list[int]], targets: list[list[int]], max_positions: int) -> Batch:
    src = [clip_source(s, max_positions) for s in sources]
    tgt = [list(t[: max_positions - 1]) for t in targets]
    return Batch(pad(src), pad([[BOS] + t for t in tgt]), pad([t + [EOS] for t in tgt]))


def token_batches(
    src_lens: list[int], tgt_lens: list[int], max_tokens: int, seed: int, shuffle: bool = True
) -> list[list[int]]:
    """Index lists, each batch within `max_tokens` padded source+target tokens (+BOS/EOS)."""
    order = list(range(len(src_lens)))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
    cost = [(src_lens[i] + 1, tgt_lens[i] + 1) for i in range(len(src_lens))]
    avg = sum(s + t for s, t in cost) / max(len(cost), 1)
    pool_size = max(1, int(POOL_BATCHES * max_tokens / max(avg, 1)))
    batches: list[list[int]] = []
    for start in range(0, len(order), pool_size):
        pool = sorted(order[start : start + pool_size], key=lambda i: cost[i])
        batch: list[int] = []
        max_s = max_t = 0
        for i in pool:
            s, t = cost[i]
            ns, nt = max(max_s, s), max(max_t, t)
            if batch and (len(batch) + 1) * (ns + nt) > max_tokens:
                batches.append(batch)
                batch, ns, nt = [], s, t
            batch.append(i)
            max_s, max_t = ns, nt
        if batch:
            batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def load_encoded(directory, split: str) -> tuple[list[list[int]], list[list[int]]]:
    """Source and target id lists of one split of the `tokenize` output."""
    from datasets import load_from_disk

    part = load_from_disk(str(directory))[split]
    return list(part["source_ids"]), list(part["target_ids"])
