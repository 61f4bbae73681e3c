"""Several corpora into one split: de-duplicated across corpora, kept away from the test set, the
training part weighted per corpus, every count kept per corpus (the split stage's work).

A weight oversamples as OpenNMT-py's corpus weights do, but fixed in the data rather than drawn
per batch: each training pair of a corpus appears `floor(weight)` times, and a seeded sample of
the fraction left over (round(fraction x its training pairs)) once more. Weight 1 leaves a corpus
as it is, 2 doubles it, 0.5 keeps a seeded half. Valid and test are carved from the pooled pairs
before weighting, so a weight never copies a pair into two parts and never changes what is
scored.

A pair two corpora share is kept by the corpus listed first (later ones count it as a
duplicate); a pair whose source sentence is in the test set is dropped from train and valid
(counted as `dropped_in_test_set`)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams
from src.core.text import read_lines
from src.data.splitting import Pair, part_of_each, read_pairs

DROP_REASONS = ("empty", "malformed", "too_long", "duplicate")


@dataclass(frozen=True)
class CorpusFile:
    name: str
    path: Path
    weight: float


@dataclass
class Mixed:
    parts: dict[str, list[Pair]]
    counts: dict[str, dict[str, int]]  # per corpus name


def read_corpora(corpora: list[CorpusFile], pair: PairParams, max_chars: int):
    """All corpora's cleaned pairs in list order, the corpus index of each, and per-corpus
    counts of lines read and pairs dropped (a pair an earlier corpus has is a duplicate)."""
    pairs: list[Pair] = []
    owner: list[int] = []
    counts: dict[str, dict[str, int]] = {}
    seen: set[Pair] = set()
    for index, corpus in enumerate(corpora):
        lines = read_lines(corpus.path)
        cleaned = read_pairs(lines, pair, max_chars, seen=seen)
        counts[corpus.name] = {
            "read": len(cleaned.pairs) + sum(cleaned.dropped.values()),
            **{f"dropped_{why}": cleaned.dropped.get(why, 0) for why in DROP_REASONS},
        }
        pairs += cleaned.pairs
        owner += [index] * len(cleaned.pairs)
    return pairs, owner, counts


def copies(n_train: int, weight: float, rng: random.Random) -> list[int]:
    """How many times each of a corpus's `n_train` training pairs is taken at `weight`."""
    whole, fraction = math.floor(weight), weight - math.floor(weight)
    extra = set(rng.sample(range(n_train), round(fraction * n_train)))
    return [whole + (i in extra) for i in range(n_train)]


def mix(corpora: list[CorpusFile], pair: PairParams, cfg: SplitParams,
        test: list[Pair] | None = None, held_out: frozenset[str] = frozenset()) -> Mixed:
    """The parts train/valid/test of the pooled corpora (see the module docstring); pairs
    whose source is in `test` or `held_out` (the named test sets' sources) are left out."""
    pairs, owner, counts = read_corpora(corpora, pair, cfg.max_chars)
    if not pairs:
        raise PipelineError(f"{', '.join(str(c.path) for c in corpora)}: no valid "
                            f"'{pair.source_lang}<TAB>{pair.target_lang}' line found")
    labels = part_of_each(pairs, cfg, test, held_out)
    per_corpus = [Counter() for _ in corpora]
    for index, label in zip(owner, labels):
        per_corpus[index][label] += 1
    times = {}
    for index, corpus in enumerate(corpora):
        rng = random.Random(f"{cfg.seed}/{corpus.name}")
        times[index] = iter(copies(per_corpus[index]["train"], corpus.weight, rng))
    parts: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    weighted = Counter()
    for one, index, label in zip(pairs, owner, labels):
        if label == "train":
            taken = next(times[index])
            parts["train"] += [one] * taken
            weighted[index] += taken
        elif label in parts:
            parts[label].append(one)
    if test:
        parts["test"] = list(test)
    for index, corpus in enumerate(corpora):
        got = per_corpus[index]
        counts[corpus.name] |= {
            "dropped_in_test_set": got["in_test_set"],
            "kept": got["train"] + got["valid"] + got["test"],
            "train": got["train"], "valid": got["valid"], "test": got["test"],
            "unused_by_train_fraction": got["unused"],
            "train_weighted": weighted[index],
        }
    return Mixed(parts, counts)
