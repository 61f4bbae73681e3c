"""What one epoch trains on: the corpus, with subwords re-sampled and pairs joined from it.

Data-side regularisers for small corpora, each off at 0 and drawn afresh each epoch from
(train.seed, epoch), so a resumed run and every data-parallel rank see the same pairs. Only
the train split is ever changed; valid, test and inference keep the best segmentation.

* **Subword regularisation** (`train.subword_alpha`; Kudo, ACL 2018): each epoch every
  training sentence takes one of its NBEST most likely SentencePiece segmentations, with
  probability proportional to P(segmentation)^alpha, so the model sees "friend" as ▁friend
  one epoch and ▁f r i en d another. The candidates are listed once per run; the draw uses our
  own seeded generator, because SentencePiece's built-in sampling (`enable_sampling`) differs
  from process to process whatever seed it is given, which would break exact resume and make
  data-parallel ranks disagree.
* **Concatenation augmentation** (`train.concat_ratio`): extra pairs that join two random
  training pairs on both sides (`EpochPairs`).
* **Corpora weighted per epoch** (a corpus's `per_epoch: true`, src/data/mixing.py): each
  epoch takes a new seeded share of their rows, so a dictionary at weight 0.1 shows a
  different tenth of its entries every epoch.
* **Bidirectional training** (`train.bidirectional_epochs`; Ding et al., "Improving Neural
  Machine Translation by Bidirectional Training", EMNLP 2021): the first epochs also train on
  every pair reversed (target -> source), so the shared vocabulary and both embeddings learn
  from twice the sentences; later epochs are the corpus's own direction only.

And one regulariser per step: **target word dropout** (`train.target_word_dropout`), which
hides decoder-input tokens behind <unk> (`drop_target_words`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from src.data.batching import Ragged
from src.data.corpus_weights import epoch_rows
from src.data.subword import EOS, UNK

# Segmentation candidates per sentence (Kudo's l-best sampling, l = 32): short sentences have
# fewer, and 32 lists the alternatives that carry nearly all the probability mass.
NBEST = 32


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
class Segmentations:
    """Each sentence's candidate segmentations and their log-probabilities (one list per run).

    Candidate c is values[offsets[c]:offsets[c + 1]] with log-probability scores[c]; sentence
    i owns candidates first[i] to first[i + 1] - 1.
    """

    values: np.ndarray
    offsets: np.ndarray
    scores: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, processor, texts: list[str], nbest: int = NBEST) -> Segmentations:
        rows, scores, counts = [], [], []
        for start in range(0, len(texts), 10_000):  # protos of a chunk at a time
            for sentence in processor.nbest_encode(texts[start:start + 10_000],
                                                   return_type="proto", nbest_size=nbest):
                counts.append(max(len(sentence.nbests), 1))
                for candidate in sentence.nbests:
                    rows.append([piece.id for piece in candidate.pieces])
                    scores.append(candidate.score)
                if not sentence.nbests:  # an empty sentence: its one segmentation is empty
                    rows.append([])
                    scores.append(0.0)
        ragged = Ragged.from_rows(rows)
        first = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=first[1:])
        return cls(ragged.values, ragged.offsets, np.asarray(scores, dtype=np.float64), first)

    def sample(self, alpha: float, rng: np.random.Generator) -> Ragged:
        """One candidate per sentence, P ∝ exp(alpha × score), by the Gumbel-max trick."""
        keys = alpha * self.scores + rng.gumbel(size=len(self.scores))
        owner = np.repeat(np.arange(len(self.first) - 1), np.diff(self.first))
        # candidates sorted by (sentence, key): each sentence's last one has the largest key
        order = np.lexsort((keys, owner))
        return Ragged(self.values, self.offsets).take(order[self.first[1:] - 1])


def both_directions(sources: Ragged, targets: Ragged) -> tuple[Ragged, Ragged]:
    """The pairs, then the same pairs reversed: (sources + targets, targets + sources)."""
    def stacked(first: Ragged, second: Ragged) -> Ragged:
        offsets = np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]])
        return Ragged(np.concatenate([first.values, second.values]), offsets)

    return stacked(sources, targets), stacked(targets, sources)


@dataclass
class TrainingCorpus:
    """The training split, and how each epoch varies it."""

    ids: tuple[Ragged, Ragged]  # the tokenize stage's ids (best segmentation)
    seed: int
    concat_ratio: float = 0.0
    subword_alpha: float = 0.0
    candidates: tuple[Segmentations, Segmentations] | None = None  # for subword_alpha > 0
    bidirectional_epochs: int = 0  # epochs 0..N-1 also train on the reversed pairs
    # per row: its corpus's weight where that corpus is drawn per epoch, else 0 (None: none is)
    drawn_weight: np.ndarray | None = None
    # The last epoch built: train counts the first epoch's steps at start-up, then trains on
    # it; sampling 1M sentences' subwords or doubling them twice would cost a minute.
    _last: tuple[int, EpochPairs] | None = field(default=None, repr=False)

    def epoch(self, epoch: int) -> EpochPairs:
        if self._last is None or self._last[0] != epoch:
            self._last = (epoch, self._build(epoch))
        return self._last[1]

    def _build(self, epoch: int) -> EpochPairs:
        sources, targets = self.ids
        if self.subword_alpha > 0:
            rng = np.random.default_rng((self.seed, epoch, 1))
            sources, targets = (side.sample(self.subword_alpha, rng) for side in self.candidates)
        if self.drawn_weight is not None:
            rows = epoch_rows(self.drawn_weight, (self.seed, epoch))
            sources, targets = sources.take(rows), targets.take(rows)
        if epoch < self.bidirectional_epochs:
            sources, targets = both_directions(sources, targets)
        return EpochPairs(sources, targets,
                          joined_pairs(len(sources), self.concat_ratio, (self.seed, epoch)))


def drop_target_words(tgt_in: torch.Tensor, p: float) -> torch.Tensor:
    """Decoder inputs with each subword replaced by <unk> with probability `p` (BOS and PAD
    kept), so the decoder leans less on its own history and more on the source (target word
    dropout; Sennrich & Zhang, ACL 2019; Araabi & Monz, COLING 2020). The labels are unchanged.
    Draws from torch's generator, which last.pt saves, so a resumed run drops the same words.
    """
    if p <= 0:
        return tgt_in
    hide = (torch.rand(tgt_in.shape, device=tgt_in.device) < p) & (tgt_in > EOS)
    return tgt_in.masked_fill(hide, UNK)
