"""The generation contract of the exported model: the names of its inputs, outputs and metadata,
and how to feed one `session.run` and read what it returns. numpy only (no torch, no
onnxruntime import), so `src.infer`, the MLflow model, the benchmarks and export's own checks all
run the graph the same way.

The graph (built by src/graph/onnx_graph.py) takes the inputs in `SEARCH_INPUTS`: `input_ids` int32
(B, S), source ids ending with EOS, right-padded with PAD; then `max_length` (the BOS start
token + new tokens), `min_length`, `num_beams`, `num_return_sequences`, `length_penalty`,
`repetition_penalty`, and an optional `SCORE_SWITCH`. It returns `sequences` (B, N, T): BOS,
the tokens, PAD, N = `num_return_sequences` hypotheses per sentence, best first; and
`sequences_scores` (B, N): sum(log p) / length**length_penalty. Its metadata_props
(`METADATA_KEYS`) carry the special ids, the limits, the export's default search settings and
the tokenizer fingerprints; `format` is `GRAPH_FORMAT`. A file of another format is refused
(`check_format`): one version of the contract is read, the one written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from src.core.errors import PipelineError

# Metadata `format`. Bump both when the contract changes, and add the old names to
# RETIRED_FORMATS: readers handle the one version they write, never a file's age.
GRAPH_FORMAT = "nmt-beamsearch-2"
# A text model (src/graph/text_twin.py): `text` strings (B,) -> `translation` strings (B,) and
# `score` (B,), and each sentence's n-best list, `translations` and `scores` (B, N), N the
# optional input `num_return_sequences` (left out: 1); SentencePiece inside through the
# onnxruntime-extensions operators, around the same search.
TEXT_FORMAT = "nmt-text-2"
RETIRED_FORMATS = ("nmt-beamsearch-1", "nmt-text-1")
TEXT_INPUT, TEXT_OUTPUT, TEXT_SCORE = "text", "translation", "score"
TEXT_N_BEST_TEXTS, TEXT_N_BEST_SCORES = "translations", "scores"
# A text model's metadata holds its source SentencePiece model (base64), so a Python caller
# batches a file by source tokens exactly as the generation model's translator does.
TEXT_SOURCE_TOKENIZER = "source_tokenizer_base64"
SEARCH_INPUTS = ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences",
                 "length_penalty", "repetition_penalty"]
# An optional input (int32 (1,); left out: 1): 0 lets a batch's greedy search skip its scores
# (`sequences_scores` is then 0 there), the one search with no other use for log-probabilities.
# The fp16 file's and the text models' searches take it too.
SCORE_SWITCH = "return_scores"
SEARCH_OUTPUTS = ("sequences", "sequences_scores")
METADATA_KEYS = ["format", "pad_id", "bos_id", "eos_id", "max_source_tokens",
                 "max_output_tokens", "beam_size", "length_penalty", "max_length_ratio",
                 "source_tokenizer_sha256", "target_tokenizer_sha256"]
MAX_BEAM = 128  # ONNX Runtime's BeamSearch refuses larger beams inside session.run


def max_new_tokens(longest_source: int, ratio: float, limit: int) -> int:
    """How many tokens a translation may have: `ratio` × the longest source row (ids with
    EOS) + 10, never past the model's `limit`. Every decoder (PyTorch and ONNX) uses this."""
    return min(int(ratio * longest_source) + 10, limit)


def search_feeds(src: np.ndarray, new_tokens: int, beam: int, length_penalty: float,
                 n_best: int = 1, scores: bool = True) -> dict[str, np.ndarray]:
    """Inputs of one `session.run`: src (B, S) ids with EOS, right-padded with PAD; `scores`
    False lets the file skip the work for them."""
    return {
        "input_ids": src if src.dtype == np.int32 else src.astype(np.int32),
        "max_length": np.array([new_tokens + 1], np.int32),  # + the BOS start token
        **_search_settings(beam, length_penalty, n_best, scores),
    }


@lru_cache(maxsize=64)
def _search_settings(beam: int, length_penalty: float, n_best: int,
                     scores: bool) -> dict[str, np.ndarray]:
    """The feeds that stay the same from sentence to sentence, built once and shared by every
    call (read-only, so no caller can change another's): at batch 1 the Python around each
    run is a few percent of a sentence (docs/engines.md)."""
    feeds = {
        "min_length": np.array([0], np.int32),
        "num_beams": np.array([beam], np.int32),
        "num_return_sequences": np.array([n_best], np.int32),
        "length_penalty": np.array([length_penalty], np.float32),
        "repetition_penalty": np.array([1.0], np.float32),
        **score_switch(scores),
    }
    for array in feeds.values():
        array.flags.writeable = False
    return feeds


def score_switch(scores: bool) -> dict[str, np.ndarray]:
    """The feed that turns a file's score work on or off."""
    return {SCORE_SWITCH: np.array([int(scores)], np.int32)}


def check_format(meta: Mapping[str, str], path, expected: tuple[str, ...]) -> str:
    """The file's metadata `format` if it is one of `expected`; else one line saying what the
    file is: written by an older export (write it again), or not a file of ours."""
    found = meta.get("format")
    if found in expected:
        return found
    if found in RETIRED_FORMATS:
        raise PipelineError(f"{path} was written by an older version of the export (format "
                            f"{found}; this version reads {' and '.join(expected)}): export it "
                            f"again with python -m src.export (dvc repro export)")
    raise PipelineError(f"{path} is not a translation model written by src.export (metadata "
                        f"format {found!r}, expected {' or '.join(expected)})")


def parse_sequences(sequences: np.ndarray, pad: int) -> list[list[int]]:
    """(B, N, T) output -> the first (best) hypothesis's token ids per row, without the BOS and
    the padding (the graph never writes EOS)."""
    return [[t for t in row[0][1:] if t != pad] for row in sequences.tolist()]


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of a search: its token ids (no BOS, no EOS) and its score,
    sum(log p) / length**length_penalty."""

    ids: list[int]
    score: float


def parse_hypotheses(sequences: np.ndarray, scores: np.ndarray,
                     pad: int) -> list[list[Hypothesis]]:
    """(B, N, T) sequences and (B, N) scores -> N hypotheses per row, best first."""
    # read as Python lists: numpy scalars one by one are slow, and JSON cannot write them
    return [[Hypothesis([t for t in hyp[1:] if t != pad], score)
             for hyp, score in zip(row, row_scores)]
            for row, row_scores in zip(sequences.tolist(), scores.tolist())]


def run_search(session, src: np.ndarray, new_tokens: int, beam: int, length_penalty: float,
               pad: int = 0) -> list[list[int]]:
    """The best hypothesis's token ids per row (its score not asked for)."""
    (sequences,) = session.run(["sequences"], search_feeds(src, new_tokens, beam,
                                                           length_penalty, scores=False))
    return parse_sequences(sequences, pad)


def run_search_scored(session, src: np.ndarray, new_tokens: int, beam: int,
                      length_penalty: float, pad: int, n_best: int = 1
                      ) -> list[list[Hypothesis]]:
    """`n_best` hypotheses per row with their scores."""
    sequences, scores = session.run(list(SEARCH_OUTPUTS), search_feeds(
        src, new_tokens, beam, length_penalty, n_best))
    return parse_hypotheses(sequences, scores, pad)


def pad_rows(rows: list[list[int]], pad: int) -> np.ndarray:
    if rows and all(len(row) == len(rows[0]) for row in rows):  # one sentence, or one length
        return np.array(rows, dtype=np.int32)
    src = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=np.int32)
    for i, row in enumerate(rows):
        src[i, : len(row)] = row
    return src

