"""Cleaning pairs and splitting them: empty, malformed and over-long lines dropped and counted;
each distinct source sentence, with all its translations, in exactly one of train, valid or test
(the split stage's work).

The split works on Arrow columns, never on a Python list of all pairs: a source sentence's part
is found from its rank among the sorted distinct sources and a seeded permutation of the ranks,
which puts every sentence exactly where shuffling the sorted sources with `random.Random(seed)`
puts it (`random.shuffle` moves items by index only), so the parts do not depend on how the
pairs are held."""

from __future__ import annotations

import random
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from src.core.atomic import atomic_dir
from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams

Pair = tuple[str, str]
# part codes of `part_codes`, in this order
PARTS = ("train", "valid", "test", "unused", "in_test_set")
TRAIN, VALID, TEST, UNUSED, IN_TEST_SET = range(len(PARTS))


@dataclass
class Cleaned:
    pairs: list[Pair] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)


def clean_text(text: str) -> str:
    return " ".join(text.replace("\ufeff", "").split())


def clean_pairs(lines: Iterable[str], pair: PairParams, max_chars: int,
                dropped: Counter) -> Iterator[Pair]:
    """(source, target) of each TSV line (already split at "\\n", see src.core.text), streamed;
    why a line gave none is counted in `dropped` (empty, malformed, too_long)."""
    need = max(pair.source_column, pair.target_column) + 1
    for line in lines:
        if not line.strip():
            dropped["empty"] += 1
            continue
        cols = line.split("\t")
        if len(cols) < need:
            dropped["malformed"] += 1
            continue
        src, tgt = clean_text(cols[pair.source_column]), clean_text(cols[pair.target_column])
        if not src or not tgt:
            dropped["empty"] += 1
        elif len(src) > max_chars or len(tgt) > max_chars:
            dropped["too_long"] += 1
        else:
            yield src, tgt


def read_pairs(lines: Iterable[str], pair: PairParams, max_chars: int) -> Cleaned:
    """Every cleaned pair of `lines`, duplicates included (a test set is kept whole)."""
    out = Cleaned()
    out.pairs = list(clean_pairs(lines, pair, max_chars, out.dropped))
    return out


def pairs_table(pairs: list[Pair]) -> pa.Table:
    return pa.table({"source": pa.array([s for s, _ in pairs], pa.string()),
                     "target": pa.array([t for _, t in pairs], pa.string())})


def group_count(size: float, n_groups: int) -> int:
    """`split.valid_size`/`test_size`: a fraction of the groups if < 1, else a count."""
    return int(round(size * n_groups)) if size < 1 else int(size)


def shuffled_positions(n: int, seed: int | str) -> np.ndarray:
    """Where `random.Random(seed).shuffle` puts each of `n` items: position[i] of item i."""
    order = array("q", range(n))
    random.Random(seed).shuffle(order)
    position = np.empty(n, np.int64)
    position[np.frombuffer(order, np.int64)] = np.arange(n)
    return position


def part_codes(sources: pa.Array | pa.ChunkedArray, cfg: SplitParams,
               test_sources: frozenset[str] = frozenset(), predefined_test: bool = False
               ) -> np.ndarray:
    """The part (an index into PARTS) of each row's source sentence, whole source-sentence
    groups at a time: the distinct sources, sorted and shuffled with `split.seed`, give valid
    first, then test (none when the test set is `predefined_test`), then train.

    A row whose source is in `test_sources` (a predefined test set's and the named test sets'
    sources) is IN_TEST_SET (left out); one of the training sources that
    `split.train_fraction` < 1 leaves out is UNUSED."""
    in_test = pc.is_in(sources, value_set=pa.array(sorted(test_sources), pa.string()))
    in_test = in_test.to_numpy(zero_copy_only=False)
    distinct = pc.unique(sources.filter(pa.array(~in_test)))
    distinct = distinct.take(pc.array_sort_indices(distinct))
    n_sources = len(distinct)
    n_valid = group_count(cfg.valid_size, n_sources)
    n_test = 0 if predefined_test else group_count(cfg.test_size, n_sources)
    if n_valid + n_test >= n_sources:
        raise PipelineError(
            f"split: valid ({n_valid}) + test ({n_test}) source sentences leave none of "
            f"{n_sources} for training; lower split.valid_size/test_size"
        )
    position = shuffled_positions(n_sources, cfg.seed)
    code_of_rank = np.full(n_sources, TRAIN, np.int8)
    code_of_rank[position < n_valid + n_test] = TEST
    code_of_rank[position < n_valid] = VALID
    if cfg.train_fraction < 1:  # a seeded share of the training sources, drawn apart
        first = n_valid + n_test
        training = position >= first
        n_training = n_sources - first
        keep = max(1, int(round(cfg.train_fraction * n_training)))
        drawn = shuffled_positions(n_training, f"{cfg.seed}/train_fraction")
        code_of_rank[training] = np.where(drawn[position[training] - first] < keep,
                                          TRAIN, UNUSED)
    rank = pc.index_in(sources, value_set=distinct).fill_null(0)
    codes = code_of_rank[rank.to_numpy(zero_copy_only=False)]
    codes[in_test] = IN_TEST_SET
    return codes


def split_grouped(pairs: list[Pair], cfg: SplitParams, test: list[Pair] | None = None
                  ) -> dict[str, list[Pair]]:
    """The pairs of each part of one list of pairs (see `part_codes`); a predefined `test`
    is the test part."""
    sources = pa.array([s for s, _ in pairs], pa.string())
    codes = part_codes(sources, cfg, frozenset(s for s, _ in test or ()), bool(test))
    parts = {name: [one for one, code in zip(pairs, codes) if PARTS[code] == name]
             for name in ("train", "valid", "test")}
    if test:
        parts["test"] = list(test)
    return parts


def one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (how the stored files are laid out), copied only if it must be."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def write_parts(parts: dict[str, pa.Table], out_dir: Path) -> None:
    """One DatasetDict of `source`/`target` string columns (and the training part's
    `drawn_weight`, where a corpus is weighted per epoch), written whole or not at all."""
    from datasets import Dataset, DatasetDict, disable_progress_bars

    disable_progress_bars()
    dataset = DatasetDict({
        name: Dataset.from_dict({column: one_chunk(table[column])
                                 for column in table.column_names})
        for name, table in parts.items()
    })
    with atomic_dir(out_dir) as tmp:
        dataset.save_to_disk(str(tmp))
