"""What one epoch trains on: the corpus, and pairs joined from it.

**Concatenation augmentation** (`train.concat_ratio`, off at 0): extra pairs that join two
random training pairs on both sides (`EpochPairs`), drawn afresh each epoch from
(train.seed, epoch), so a resumed run and every data-parallel rank see the same pairs. Only
the train split is ever joined.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from src.batching import Ragged


def joined_pairs(n_pairs: int, ratio: float, seed: tuple[int, ...]) -> np.ndarray:
    """(K, 2) indices of distinct corpus pairs to join, K = round(ratio × n_pairs), drawn
    from `seed` (the run's seed and the epoch): concatenation augmentation, afresh each epoch.
    """
    count = round(ratio * n_pairs) if n_pairs > 1 else 0
    rng = np.random.default_rng(seed)
    first = rng.integers(0, n_pairs, count) if count else np.zeros(0, np.int64)
    # any other pair: an offset of 1..n-1 never lands on `first` itself
    second = (first + 1 + rng.integers(0, n_pairs - 1, count)) % n_pairs if count else first
    return np.stack([first, second], axis=1).astype(np.int64)


@dataclass
class EpochPairs:
    """One epoch's training pairs: the corpus, then the joined pairs.

    Pair n_corpus + k is corpus pair joined[k, 0] followed by corpus pair joined[k, 1] on both
    sides. The ids are simply concatenated: SentencePiece starts every sentence with "▁", so
    that is the text of the two joined by a space, with no separator token (Nguyen, Murray &
    Chiang, IWSLT 2021; Kondo et al., NAACL SRW 2021).
    """

    sources: Ragged
    targets: Ragged
    joined: np.ndarray  # (K, 2)

    def __len__(self) -> int:
        return len(self.sources) + len(self.joined)

    def _side(self, side: Ragged, i: int) -> np.ndarray:
        if i < len(side):
            return side[i]
        first, second = self.joined[i - len(side)]
        return np.concatenate([side[first], side[second]])

    def source(self, i: int) -> np.ndarray:
        return self._side(self.sources, i)

    def target(self, i: int) -> np.ndarray:
        return self._side(self.targets, i)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Source and target lengths of every pair, the joined ones last."""
        def side(lengths: np.ndarray) -> np.ndarray:
            return np.concatenate([lengths, lengths[self.joined].sum(axis=1)])

        return side(self.sources.lengths()), side(self.targets.lengths())


@dataclass
class TrainingCorpus:
    """The training split, and how each epoch varies it."""

    ids: tuple[Ragged, Ragged]  # the tokenize stage's ids
    seed: int
    concat_ratio: float = 0.0

    def epoch(self, epoch: int) -> EpochPairs:
        sources, targets = self.ids
        return EpochPairs(sources, targets,
                          joined_pairs(len(sources), self.concat_ratio, (self.seed, epoch)))
