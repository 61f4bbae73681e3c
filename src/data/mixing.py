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
(counted as `dropped_in_test_set`). A `train_only` corpus (a dictionary) never gives valid or
test a pair, so they stay what the other corpora make them; its pairs whose source valid or
test hold are dropped (counted as `dropped_in_test_set` too).

A corpus marked `per_epoch` goes to the training part once, and the part gets a column
`drawn_weight` (that corpus's weight on its rows, 0 on the rest): the train stage then takes
its rows by `corpus_weights.epoch_copies` each epoch, the same rule with a new seed, so a
weight below 1 shows a different share of it every epoch instead of the same one all run.

The pooled pairs are held as Arrow columns (about the size of the text) and de-duplicated by a
64-bit digest per pair, never as a Python list of all pairs, so a corpus of millions of pairs
stays cheap to split."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams
from src.core.text import read_lines
from src.data.corpus_weights import copies
from src.data.splitting import (
    IN_TEST_SET,
    PARTS,
    TEST,
    TRAIN,
    UNUSED,
    VALID,
    Pair,
    clean_pairs,
    pairs_table,
    part_codes,
)

DROP_REASONS = ("empty", "malformed", "too_long", "duplicate")
BATCH_PAIRS = 65_536  # pairs per Arrow batch while a corpus is read


@dataclass(frozen=True)
class CorpusFile:
    name: str
    path: Path
    weight: float
    per_epoch: bool = False  # weighted by the train stage, each epoch afresh
    train_only: bool = False  # never in valid or test


@dataclass
class Mixed:
    parts: dict[str, pa.Table]  # source, target columns
    counts: dict[str, dict[str, int]]  # per corpus name


def batches(pairs: Iterator[Pair], index: int) -> Iterator[pa.RecordBatch]:
    """The pairs as Arrow batches of source, target, the corpus index and a 64-bit digest of
    the pair for `first_occurrences` (Python's own hash: salted per process, which is harmless
    since rows that share a digest are compared as text)."""
    # The batch size, Arrow's string type (what it infers from str) and fromiter's count
    # change memory and speed, not the table: pragma: no mutate on those lines.
    while chunk := list(islice(pairs, BATCH_PAIRS)):  # pragma: no mutate
        sources = pa.array([s for s, _ in chunk], pa.string())  # pragma: no mutate
        targets = pa.array([t for _, t in chunk], pa.string())  # pragma: no mutate
        digests = np.fromiter(map(hash, chunk), np.int64, len(chunk))  # pragma: no mutate
        yield pa.record_batch({"source": sources, "target": targets,
                               "corpus": pa.array(np.full(len(chunk), index, np.int32)),
                               "digest": pa.array(digests)})


def first_occurrences(table: pa.Table) -> np.ndarray:
    """True for each row whose (source, target) no earlier row has. Rows are told apart by
    their digests; only rows whose digest another row shares (duplicates, and in principle a
    collision) are compared as text, so memory stays a few bytes per row."""
    digests = table["digest"].to_numpy()
    _, first, group, size = np.unique(digests, return_index=True, return_inverse=True,
                                      return_counts=True)
    keep = np.zeros(table.num_rows, bool)
    keep[first] = True
    shared = np.flatnonzero(size[group] != 1)  # rows whose digest another has, in order
    columns = [table[name].take(pa.array(shared)).to_pylist() for name in ("source", "target")]
    seen: set[Pair] = set()
    for row, one in zip(shared, zip(*columns)):
        keep[row] = one not in seen
        seen.add(one)
    return keep


def read_corpora(corpora: list[CorpusFile], pair: PairParams, max_chars: int
                 ) -> tuple[pa.Table, dict[str, dict[str, int]]]:
    """All corpora's cleaned pairs in list order as one table (source, target, corpus index),
    each distinct pair once, and per-corpus counts of lines read and pairs dropped (a pair an
    earlier corpus or line has is a duplicate)."""
    read: list[pa.RecordBatch] = []
    dropped = [Counter() for _ in corpora]
    for index, corpus in enumerate(corpora):
        pairs = clean_pairs(read_lines(corpus.path), pair, max_chars, dropped[index])
        read += batches(pairs, index)
    schema = pa.schema({"source": pa.string(), "target": pa.string(), "corpus": pa.int32(),
                        "digest": pa.int64()})
    table = pa.Table.from_batches(read, schema)
    del read
    keep = first_occurrences(table)
    owner = table["corpus"].to_numpy()
    cleaned = np.bincount(owner, minlength=len(corpora))
    duplicates = np.bincount(owner[~keep], minlength=len(corpora))
    counts = {}
    for index, corpus in enumerate(corpora):
        lines_read = int(cleaned[index]) + sum(dropped[index].values())
        dropped[index]["duplicate"] = int(duplicates[index])
        counts[corpus.name] = {
            "read": lines_read,
            **{f"dropped_{why}": dropped[index].get(why, 0) for why in DROP_REASONS},
        }
    # one chunk: the parts taken from it are one chunk each, as `write_parts` stores them
    return table.filter(pa.array(keep)).combine_chunks(), counts


def corpus_part_codes(sources: pa.Array | pa.ChunkedArray, owner: np.ndarray,
                      corpora: list[CorpusFile], cfg: SplitParams,
                      test_sources: frozenset[str], predefined_test: bool) -> np.ndarray:
    """Each row's part (`splitting.part_codes`), valid and test drawn from the corpora that are
    not `train_only` alone, so adding a dictionary leaves them as they were. A train-only row
    is TRAIN, or IN_TEST_SET where its source is one that valid, test or a test set scores."""
    if isinstance(sources, pa.ChunkedArray):
        sources = sources.combine_chunks()
    train_only = np.array([corpus.train_only for corpus in corpora], bool)[owner]
    if train_only.all():
        raise PipelineError("every corpus is train_only: valid and test need one that is not")
    codes = np.full(len(sources), TRAIN, np.int8)
    shared = pa.array(~train_only)
    codes[~train_only] = part_codes(sources.filter(shared), cfg, test_sources, predefined_test)
    if train_only.any():
        scored = sources.filter(shared).filter(pa.array(np.isin(codes[~train_only],
                                                                [VALID, TEST])))
        kept_out = pa.concat_arrays([scored, pa.array(sorted(test_sources), pa.string())])
        in_scored = pc.is_in(sources, value_set=kept_out).to_numpy(zero_copy_only=False)
        codes[train_only & in_scored] = IN_TEST_SET
    return codes


def mix(corpora: list[CorpusFile], pair: PairParams, cfg: SplitParams,
        test: list[Pair] | None = None, held_out: frozenset[str] = frozenset()) -> Mixed:
    """The parts train/valid/test of the pooled corpora (see the module docstring); pairs
    whose source is in `test` or `held_out` (the named test sets' sources) are left out."""
    table, counts = read_corpora(corpora, pair, cfg.max_chars)
    if not table.num_rows:
        raise PipelineError(f"{', '.join(str(c.path) for c in corpora)}: no valid "
                            f"'{pair.source_lang}<TAB>{pair.target_lang}' line found")
    test_sources = frozenset(src for src, _ in test or ()) | held_out
    owner = table["corpus"].to_numpy()
    codes = corpus_part_codes(table["source"], owner, corpora, cfg, test_sources, bool(test))
    per_corpus = np.bincount(owner * len(PARTS) + codes, minlength=len(corpora) * len(PARTS))
    per_corpus = per_corpus.reshape(-1, len(PARTS))  # pragma: no mutate (numpy: -2 is -1)
    times = np.zeros(table.num_rows, np.int64)
    drawn = np.zeros(table.num_rows, np.float32)
    for index, corpus in enumerate(corpora):
        rows = np.flatnonzero((owner == index) & (codes == TRAIN))
        times[rows] = copies(len(rows), corpus.weight, random.Random(f"{cfg.seed}/{corpus.name}"))
        if corpus.per_epoch:  # counted as one epoch draws it, written once
            drawn[rows] = corpus.weight
    weighted = np.bincount(owner, weights=times, minlength=len(corpora))
    times[drawn > 0] = 1
    pairs = table.select(["source", "target"])
    train_rows = np.flatnonzero(codes == TRAIN)
    train = pairs.take(pa.array(np.repeat(train_rows, times[train_rows])))
    if any(corpus.per_epoch for corpus in corpora):
        train = train.append_column("drawn_weight", pa.array(drawn[train_rows]))
    parts = {
        "train": train,
        "valid": pairs.filter(pa.array(codes == VALID)),
        "test": pairs_table(test) if test else pairs.filter(pa.array(codes == TEST)),
    }
    for index, corpus in enumerate(corpora):
        got = per_corpus[index]
        counts[corpus.name] |= {
            "dropped_in_test_set": int(got[IN_TEST_SET]),
            "kept": int(got[TRAIN] + got[VALID] + got[TEST]),
            "train": int(got[TRAIN]), "valid": int(got[VALID]), "test": int(got[TEST]),
            "unused_by_train_fraction": int(got[UNUSED]),
            "train_weighted": int(weighted[index]),
        }
    return Mixed(parts, counts)
