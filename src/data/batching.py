"""Token-count batches from length buckets, and padding them into tensors.

Examples are shuffled, cut into pools of ~100 batches, sorted by length inside each pool (so a
batch holds sentences of similar length and little padding), packed greedily until
batch_size * (longest source + longest target) would exceed `max_tokens`, and the batch order
is shuffled again. Everything depends only on (seed, epoch), so a resumed run sees the same
batches in the same order, and every data-parallel rank computes the same list and takes its
share of each optimizer step (`rank_share`).

Encoded splits are read from the Arrow files of `tokenize` into two flat arrays per side
(`Ragged`): a million sentence pairs cost a few hundred MB, not millions of Python lists.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from src.data.subword import BOS, EOS, PAD

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
        tensors = (self.src, self.tgt_in, self.tgt_out)
        # `.to(None)` is a no-op on the CPU: only a GPU could tell its mutant apart
        return Batch(*(t.to(device) for t in tensors))  # pragma: no mutate


def clip_source(ids: list[int], max_positions: int) -> list[int]:
    return list(ids[: max_positions - 1]) + [EOS]


def round_up(length, multiple: int):
    """The smallest multiple of `multiple` >= length (ints or numpy arrays)."""
    return -(-length // multiple) * multiple


def pad(rows, multiple: int = 1) -> Tensor:
    """Rows (lists or arrays of ids) right-padded with PAD into a (B, width) long tensor, width
    the longest row rounded up to `multiple`."""
    width = round_up(max(len(r) for r in rows), multiple)
    out = np.full((len(rows), width), PAD, dtype=np.int64)  # pragma: no mutate (the default)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)


def make_batch(sources, targets, max_positions: int, length_multiple: int = 1) -> Batch:
    """Widths rounded up to `length_multiple` but never past `max_positions`."""
    src = [clip_source(s, max_positions) for s in sources]
    tgt = [list(t[: max_positions - 1]) for t in targets]
    src_ids = pad(src, length_multiple)[:, :max_positions]
    tgt_in = pad([[BOS] + t for t in tgt], length_multiple)[:, :max_positions]
    return Batch(src_ids, tgt_in,
                 pad([t + [EOS] for t in tgt], length_multiple)[:, :max_positions])


def token_batches(src_lens, tgt_lens, max_tokens: int, seed: int, shuffle: bool = True,
                  length_multiple: int = 1) -> list[list[int]]:
    """Index lists, each batch within `max_tokens` padded source+target tokens (+BOS/EOS), the
    widths rounded up to `length_multiple` as `make_batch` pads them."""
    n = len(src_lens)
    if not n:
        return []
    order = list(range(n))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
    # int64 is what numpy infers from the lengths anyway: pragma: no mutate on these lines
    src_cost = np.asarray(src_lens, dtype=np.int64) + 1  # pragma: no mutate
    tgt_cost = np.asarray(tgt_lens, dtype=np.int64) + 1  # pragma: no mutate
    src_width = round_up(src_cost, length_multiple)  # what a batch pads each one to
    tgt_width = round_up(tgt_cost, length_multiple)
    avg = float(np.mean(src_cost + tgt_cost))  # tokens of an example, at least 2
    pool_size = max(1, int(POOL_BATCHES * max_tokens / avg))
    batches: list[list[int]] = []
    for start in range(0, n, pool_size):
        pool = np.asarray(order[start : start + pool_size], dtype=np.int64)  # pragma: no mutate
        # by source then target cost; stable, so ties keep the shuffled order
        pool = pool[np.lexsort((tgt_cost[pool], src_cost[pool]))]
        batch: list[int] = []
        max_s = max_t = 0  # pragma: no mutate (every width is >= 1: 0 and 1 start alike)
        for i, s, t in zip(pool.tolist(), src_width[pool].tolist(), tgt_width[pool].tolist()):
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


def batches_per_step(accumulation_steps: int, world_size: int) -> int:
    """Batches one optimizer step consumes: `accumulation_steps` on each rank."""
    return accumulation_steps * world_size


def steps_in_epoch(n_batches: int, accumulation_steps: int, world_size: int) -> int:
    """One process takes a short last step; ranks drop the remainder, so every rank takes the
    same number of steps (an uneven last step would leave one rank waiting forever)."""
    span = batches_per_step(accumulation_steps, world_size)
    return n_batches // span if world_size > 1 else math.ceil(n_batches / span)


def rank_share(group: list, rank: int, world_size: int) -> list:
    """This rank's batches of one optimizer step's group (every rank gets as many)."""
    return group[rank::world_size]


@dataclass
class Ragged:
    """Token id rows as one flat array and offsets: row i is values[offsets[i]:offsets[i+1]]."""

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def tolist(self) -> list[list[int]]:
        return [self[i].tolist() for i in range(len(self))]

    def take(self, rows: np.ndarray) -> Ragged:
        """Rows `rows` in that order (a row may come several times), as a new array."""
        lengths = np.diff(self.offsets)[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        gather = np.repeat(self.offsets[rows] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Ragged(self.values[gather], offsets)

    @classmethod
    def from_rows(cls, rows: list[list[int]]) -> Ragged:
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        # the count only saves re-allocations: pragma: no mutate
        values = np.fromiter((i for r in rows for i in r), dtype=np.int32,
                             count=offsets[-1])  # pragma: no mutate
        return cls(values, offsets)


def ragged_column(column) -> Ragged:
    """A list<int> Arrow column (memory-mapped, any number of chunks) as a Ragged array."""
    import pyarrow.compute as pc

    chunks = column.chunks or []
    # our columns hold no nulls, so a zero-copy read succeeds too: pragma: no mutate below
    lengths = [pc.list_value_length(c).to_numpy(zero_copy_only=False)  # pragma: no mutate
               for c in chunks]
    values = [pc.list_flatten(c).to_numpy(zero_copy_only=False)  # pragma: no mutate
              for c in chunks]
    offsets = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    flat = np.concatenate(values).astype(np.int32) if values else np.zeros(0, np.int32)
    return Ragged(flat, offsets)


def load_encoded(directory, split: str) -> tuple[Ragged, Ragged]:
    """Source and target ids of one split of the `tokenize` output."""
    from datasets import load_from_disk

    part = load_from_disk(str(directory))[split]
    return ragged_column(part.data.column("source_ids")), ragged_column(
        part.data.column("target_ids"))


def load_drawn_weight(directory) -> np.ndarray | None:
    """The train split's `drawn_weight` column (rows of a corpus weighted per epoch: its
    weight; others 0; src/data/mixing.py), or None where no corpus is."""
    from datasets import load_from_disk

    part = load_from_disk(str(directory))["train"]
    if "drawn_weight" not in part.column_names:
        return None
    return part.data.column("drawn_weight").to_numpy()
