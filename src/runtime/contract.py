"""The generation contract of the exported model: the names of its inputs, outputs and metadata,
and how to feed one `session.run` and read what it returns. numpy only (no torch, no
onnxruntime import), so `src.infer`, the MLflow model, the benchmarks and export's own checks all
run the graph the same way.

The graph (built by src/graph/onnx_graph.py) takes the inputs in `SEARCH_INPUTS`: `input_ids` int32
(B, S), source ids ending with EOS, right-padded with PAD; then `max_length` (the BOS start
token + new tokens), `min_length`, `num_beams`, `num_return_sequences`, `length_penalty`,
`repetition_penalty`, and (files written since 2026-11-28) an optional `SCORE_SWITCH`. It
returns `sequences` (B, N, T): BOS, the tokens, PAD, N = `num_return_sequences` hypotheses per
sentence, best first; and (files whose metadata `outputs` names it) `sequences_scores` (B, N):
sum(log p) / length**length_penalty. Its metadata_props
(`METADATA_KEYS`) carry the special ids, the limits, the export's default search settings and
the tokenizer fingerprints; `format` is `GRAPH_FORMAT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

GRAPH_FORMAT = "nmt-beamsearch-1"  # metadata `format`; bump when the contract changes
# A text model (src/graph/text_twin.py): `text` strings (B,) -> `translation` strings (B,), with
# SentencePiece inside through the onnxruntime-extensions operators, around the same search.
TEXT_FORMAT = "nmt-text-1"
TEXT_INPUT, TEXT_OUTPUT, TEXT_SCORE = "text", "translation", "score"
# Text models written since n-best lists (2026-11-28, evening) also return each sentence's list,
# (B, N) strings and scores, N the optional input `num_return_sequences` (left out: 1); their
# metadata `text_outputs` names the outputs a text model has.
TEXT_N_BEST_TEXTS, TEXT_N_BEST_SCORES = "translations", "scores"
TEXT_OUTPUTS = "text_outputs"
# Since then they also take the search's `num_beams` and `length_penalty` as optional inputs,
# each defaulting to the value the file was written with; metadata `text_inputs` names them.
TEXT_INPUTS = "text_inputs"
# A text model's metadata also holds its source SentencePiece model (base64), so a Python
# caller batches a file by source tokens exactly as the generation model's translator does.
TEXT_SOURCE_TOKENIZER = "source_tokenizer_base64"
SEARCH_INPUTS = ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences",
                 "length_penalty", "repetition_penalty"]
# An optional input of the files written since 2026-11-28 (int32 (1,); left out: 1): 0 lets a
# batch's greedy search skip its scores (`sequences_scores` is then 0 there), the one search
# with no other use for log-probabilities. Older files lack it; the fp16 files written before
# 2026-11-30 (the BeamSearch operator alone) ignore it.
SCORE_SWITCH = "return_scores"
# What a file of ours returns; files written before scores (GRAPH_FORMAT nmt-beamsearch-1
# without `outputs` in their metadata) return `sequences` only.
SEARCH_OUTPUTS = ("sequences", "sequences_scores")
# Metadata of the files whose batch Loop returns n-best lists (written since 2026-11-28,
# "loop"); in older files only the BeamSearch operator does, so their n-best batches stay
# with the whole file's session.
N_BEST_BATCHES = "n_best_batches"
METADATA_KEYS = ["format", "pad_id", "bos_id", "eos_id", "max_source_tokens",
                 "max_output_tokens", "beam_size", "length_penalty", "max_length_ratio",
                 "source_tokenizer_sha256", "target_tokenizer_sha256"]
MAX_BEAM = 128  # ONNX Runtime's BeamSearch refuses larger beams inside session.run


def max_new_tokens(longest_source: int, ratio: float, limit: int) -> int:
    """How many tokens a translation may have: `ratio` × the longest source row (ids with
    EOS) + 10, never past the model's `limit`. Every decoder (PyTorch and ONNX) uses this."""
    return min(int(ratio * longest_source) + 10, limit)


def search_feeds(src: np.ndarray, new_tokens: int, beam: int,
                 length_penalty: float, n_best: int = 1) -> dict[str, np.ndarray]:
    """Inputs of one `session.run`: src (B, S) ids with EOS, right-padded with PAD."""
    return {
        "input_ids": src if src.dtype == np.int32 else src.astype(np.int32),
        "max_length": np.array([new_tokens + 1], np.int32),  # + the BOS start token
        **_search_settings(beam, length_penalty, n_best),
    }


@lru_cache(maxsize=64)
def _search_settings(beam: int, length_penalty: float, n_best: int) -> dict[str, np.ndarray]:
    """The feeds that stay the same from sentence to sentence, built once and shared by every
    call (read-only, so no caller can change another's): at batch 1 the Python around each
    run is a few percent of a sentence (docs/engines.md)."""
    feeds = {
        "min_length": np.array([0], np.int32),
        "num_beams": np.array([beam], np.int32),
        "num_return_sequences": np.array([n_best], np.int32),
        "length_penalty": np.array([length_penalty], np.float32),
        "repetition_penalty": np.array([1.0], np.float32),
    }
    for array in feeds.values():
        array.flags.writeable = False
    return feeds


def session_feeds(session, src: np.ndarray, new_tokens: int, beam: int, length_penalty: float,
                  n_best: int = 1, scores: bool = True) -> dict[str, np.ndarray]:
    """`search_feeds` for this session's file, with the score switch where the file has it
    (`scores` False: the file may skip the work for them)."""
    return {**search_feeds(src, new_tokens, beam, length_penalty, n_best),
            **score_switch(session, scores)}


def score_switch(session, scores: bool) -> dict[str, np.ndarray]:
    """The feed that turns a file's score work on or off; none for a file without it."""
    if any(i.name == SCORE_SWITCH for i in session.get_inputs()):
        return {SCORE_SWITCH: np.array([int(scores)], np.int32)}
    return {}


def parse_sequences(sequences: np.ndarray, pad: int) -> list[list[int]]:
    """(B, N, T) output -> the first (best) hypothesis's token ids per row, without the BOS and
    the padding (the graph never writes EOS)."""
    return [[t for t in row[0][1:] if t != pad] for row in sequences.tolist()]


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of a search: its token ids (no BOS, no EOS) and its score,
    sum(log p) / length**length_penalty, or None from a file without scores."""

    ids: list[int]
    score: float | None


def parse_hypotheses(sequences: np.ndarray, scores: np.ndarray | None,
                     pad: int) -> list[list[Hypothesis]]:
    """(B, N, T) sequences and (B, N) scores (or None) -> N hypotheses per row, best first."""
    # read as Python lists: numpy scalars one by one are slow, and JSON cannot write them
    rows, hypotheses = sequences.shape[:2]
    scores = [[None] * hypotheses] * rows if scores is None else scores.tolist()
    return [[Hypothesis([t for t in hyp[1:] if t != pad], score)
             for hyp, score in zip(row, row_scores)]
            for row, row_scores in zip(sequences.tolist(), scores)]


def has_scores(meta: Mapping[str, str]) -> bool:
    """Whether a file returns `sequences_scores` (files written before scores do not)."""
    return "sequences_scores" in meta.get("outputs", "").split(",")


def run_search(session, src: np.ndarray, new_tokens: int, beam: int, length_penalty: float,
               pad: int = 0) -> list[list[int]]:
    """The best hypothesis's token ids per row (its score not asked for)."""
    (sequences,) = session.run(["sequences"], session_feeds(session, src, new_tokens, beam,
                                                            length_penalty, scores=False))
    return parse_sequences(sequences, pad)


def run_search_scored(session, src: np.ndarray, new_tokens: int, beam: int,
                      length_penalty: float, pad: int, n_best: int = 1,
                      scored: bool = True) -> list[list[Hypothesis]]:
    """`n_best` hypotheses per row with their scores (`scored` False: not asked for, or the
    file has none)."""
    names = list(SEARCH_OUTPUTS) if scored else ["sequences"]
    outputs = session.run(names, session_feeds(session, src, new_tokens, beam, length_penalty,
                                               n_best, scores=scored))
    return parse_hypotheses(outputs[0], outputs[1] if scored else None, pad)


def pad_rows(rows: list[list[int]], pad: int) -> np.ndarray:
    if rows and all(len(row) == len(rows[0]) for row in rows):  # one sentence, or one length
        return np.array(rows, dtype=np.int32)
    src = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=np.int32)
    for i, row in enumerate(rows):
        src[i, : len(row)] = row
    return src

