"""The HSK graded sentences (the `hsk-sentences-audio` wheel's sentences.json) as a test set:
English -> the original Chinese, cut into the dev and test halves everyone scores the same way
(the download stage's work for `format: hsk` test sets).

The cut: rows ordered by HSK level then id; rows with an empty side, a tab, or an English or
Chinese side that occurs in the corpus named by `unseen_in` are left out (the set measures
sentences the training corpus never shows); within each level the rest alternate dev, test,
dev, … Each row is written `english<TAB>chinese<TAB>id` in the pair's columns, so the cut of
the default corpus is byte for byte the dev.tsv and test.tsv this project scores."""

from __future__ import annotations

import json
from collections.abc import Iterable

from src.core.errors import PipelineError
from src.core.params import PairParams

PARTS = ("dev", "test")


def corpus_sides(lines: Iterable[str], pair: PairParams) -> tuple[set[str], set[str]]:
    """The stripped English and Chinese sides of a corpus TSV's lines."""
    english, chinese = set(), set()
    need = max(pair.source_column, pair.target_column) + 1
    for line in lines:
        cols = line.rstrip("\n").split("\t")
        if len(cols) >= need:
            english.add(cols[pair.column_of("en")].strip())
            chinese.add(cols[pair.column_of("zh")].strip())
    return english, chinese


def hsk_rows(data: bytes, source: str, part: str, seen: tuple[set[str], set[str]],
             pair: PairParams) -> list[list[str]]:
    """The `part` half of sentences.json's rows as TSV columns (english and chinese in the
    pair's columns, the id after them), and nothing of a row whose side `seen` holds."""
    try:
        rows = json.loads(data)
        ordered = sorted(rows, key=lambda r: (r["hsk_level"], r["id"]))
        sides = [(r["translation"]["en"].strip(), r["chinese"].strip(), r["hsk_level"], r["id"])
                 for r in ordered]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        what = f"no field {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise PipelineError(f"{source} is not the HSK sentence set's JSON (a list of rows "
                            f"with id, hsk_level, chinese, translation.en): {what}") from None
    seen_english, seen_chinese = seen
    width = max(pair.source_column, pair.target_column) + 1
    out, place_in_level = [], {}
    for english, chinese, level, row_id in sides:
        if not english or not chinese or "\t" in english + chinese:
            continue
        if english in seen_english or chinese in seen_chinese:
            continue
        place = place_in_level.get(level, 0)
        place_in_level[level] = place + 1
        if PARTS[place % 2] == part:
            cols = [""] * width
            cols[pair.column_of("en")], cols[pair.column_of("zh")] = english, chinese
            out.append([*cols, row_id])
    return out
