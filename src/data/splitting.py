"""Cleaning pairs and splitting them: empty, malformed, over-long and duplicate lines dropped and
counted; each distinct source sentence, with all its translations, in exactly one of train,
valid or test (the split stage's work)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from src.core.atomic import atomic_dir
from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams

Pair = tuple[str, str]


@dataclass
class Cleaned:
    pairs: list[Pair] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)


def clean_text(text: str) -> str:
    return " ".join(text.replace("\ufeff", "").split())


def read_pairs(lines, pair: PairParams, max_chars: int, dedupe: bool = True,
               seen: set[Pair] | None = None) -> Cleaned:
    """Parse TSV lines (already split at "\n", see src.text) into (source, target) pairs;
    count why others were dropped. `seen` carries the pairs of corpora read before, so a pair
    one of them has is a duplicate here too."""
    out = Cleaned()
    seen = set() if seen is None else seen
    need = max(pair.source_column, pair.target_column) + 1
    for line in lines:
        if not line.strip():
            out.dropped["empty"] += 1
            continue
        cols = line.split("\t")
        if len(cols) < need:
            out.dropped["malformed"] += 1
            continue
        src, tgt = clean_text(cols[pair.source_column]), clean_text(cols[pair.target_column])
        if not src or not tgt:
            out.dropped["empty"] += 1
        elif len(src) > max_chars or len(tgt) > max_chars:
            out.dropped["too_long"] += 1
        elif dedupe and (src, tgt) in seen:
            out.dropped["duplicate"] += 1
        else:
            seen.add((src, tgt))
            out.pairs.append((src, tgt))
    return out


def group_count(size: float, n_groups: int) -> int:
    """`split.valid_size`/`test_size`: a fraction of the groups if < 1, else a count."""
    return int(round(size * n_groups)) if size < 1 else int(size)


def part_of_each(pairs: list[Pair], cfg: SplitParams, test: list[Pair] | None = None,
                 held_out: frozenset[str] = frozenset()) -> list[str]:
    """Which part each pair goes to: "train", "valid" or "test", whole source-sentence groups
    at a time (valid first, then test, from the sources shuffled with `split.seed`).

    With a predefined `test`, only valid and train are carved out. A pair whose source sentence
    is a source of `test` or in `held_out` (the named test sets) is "in_test_set" (left out);
    one of the training sources that `split.train_fraction` < 1 leaves out is "unused"."""
    test_sources = ({src for src, _ in test} if test else set()) | held_out
    sources = sorted({src for src, _ in pairs if src not in test_sources})
    random.Random(cfg.seed).shuffle(sources)
    n_valid = group_count(cfg.valid_size, len(sources))
    n_test = 0 if test else group_count(cfg.test_size, len(sources))
    if n_valid + n_test >= len(sources):
        raise PipelineError(
            f"split: valid ({n_valid}) + test ({n_test}) source sentences leave none of "
            f"{len(sources)} for training; lower split.valid_size/test_size"
        )
    part_of = {s: "valid" for s in sources[:n_valid]}
    part_of.update({s: "test" for s in sources[n_valid : n_valid + n_test]})
    if cfg.train_fraction < 1:  # a seeded share of the training sources, drawn apart
        training = sources[n_valid + n_test:]
        random.Random(f"{cfg.seed}/train_fraction").shuffle(training)
        keep = max(1, int(round(cfg.train_fraction * len(training))))
        part_of.update({s: "unused" for s in training[keep:]})
    part_of.update({s: "in_test_set" for s in test_sources})
    return [part_of.get(src, "train") for src, _ in pairs]


def split_grouped(
    pairs: list[Pair], cfg: SplitParams, test: list[Pair] | None = None
) -> dict[str, list[Pair]]:
    """The pairs of each part (see `part_of_each`); a predefined `test` is the test part."""
    parts: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    for pair, part in zip(pairs, part_of_each(pairs, cfg, test)):
        if part in parts:
            parts[part].append(pair)
    if test:
        parts["test"] = list(test)
    return parts


def write_parts(parts: dict[str, list[Pair]], out_dir: Path) -> None:
    from datasets import Dataset, DatasetDict, disable_progress_bars

    disable_progress_bars()
    dataset = DatasetDict(
        {
            name: Dataset.from_dict(
                {"source": [s for s, _ in rows], "target": [t for _, t in rows]}
            )
            for name, rows in parts.items()
        }
    )
    with atomic_dir(out_dir) as tmp:
        dataset.save_to_disk(str(tmp))
