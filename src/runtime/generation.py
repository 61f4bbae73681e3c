"""The generation contract of the exported model, in one place: numpy, onnxruntime and
sentencepiece only (no torch), so `src.infer`, the MLflow model, the benchmarks and export's own
checks all run the graph the same way.

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

import hashlib
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache, partial
from pathlib import Path

import numpy as np

from src.core.errors import PipelineError
from src.data.subword import decode_ids
from src.runtime import batch_graph, confidence, operator_graph, placement
from src.runtime.placement import CUDA

GRAPH_FORMAT = "nmt-beamsearch-1"  # metadata `format`; bump when the contract changes
# A text model (src/text_graph.py): `text` strings (B,) -> `translation` strings (B,), with
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
# with no other use for log-probabilities. Older files lack it; the fp16 file ignores it.
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
# 1 vs 2 threads on the 2-core dev machine, both files of the default model, one sitting
# (docs/engines.md, 500 test sentences, sent/s 1 vs 2 threads): 2 won in all 8 rows (int8:
# greedy batch 1 328 vs 484, greedy batch 32 902 vs 1265, beam 4 batch 1 225 vs 249, beam 4
# batch 32 292 vs 515; fp32 139 vs 185, 438 vs 632, 83 vs 152, 168 vs 263). The fused
# attention nodes split (batch x heads) over the threads; before them int8 was faster on 1.
DEFAULT_THREADS = 2
_OPENING = threading.Lock()  # opens a model's batch session once, whichever thread asks first
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


# -- sessions and providers --------------------------------------------------------------------
def extensions_library() -> str | None:
    """The onnxruntime-extensions operator library (SentencePiece ops of text models), found
    without importing the package: its `__init__` imports torch whenever torch is installed
    (1.8-2.2 s and ~250 MB), and a process with torch in it slows other engines too."""
    import importlib.machinery
    import importlib.util

    try:
        spec = importlib.util.find_spec("onnxruntime_extensions")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            library = Path(folder) / f"_extensions_pydll{suffix}"
            if library.is_file():
                return str(library)
    return None


@contextmanager
def native_stderr_filtered(noise: tuple[str, ...] = ("precompiled_charsmap is empty",)):
    """Drop known INFO lines that native code (SentencePiece inside onnxruntime-extensions)
    writes straight to file descriptor 2 while a session loads; pass the rest through."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(text in line for text in noise):
                    sys.stderr.write(line)


def open_session(model_path: Path, choice: str = "auto", threads: int = DEFAULT_THREADS,
                 warn: Callable[[str], None] | None = None, edited: Path | None = None):
    """A session of one of our files on the providers `placement` chooses for its kind, with
    node assignments recorded (`placement.describe`); of `edited` (a copy of the file with
    changes) instead of the file itself when given."""
    import onnxruntime as ort

    model_path = Path(model_path)
    if not model_path.is_file():
        raise PipelineError(f"model not found: {model_path} (run `dvc repro export`)")
    try:
        kind = placement.FileKind.of(placement.read_metadata(model_path))
    except PipelineError:  # not readable as ONNX: let ONNX Runtime say what is wrong
        kind = placement.FileKind.of({})
    wanted = placement.providers_for(choice, kind, ort.get_available_providers())
    # Where CUDA cannot start, ORT logs errors before falling back; we say it in one line.
    severity = 4 if CUDA in wanted else 3
    ort.set_default_logger_severity(severity)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = severity
    options.add_session_config_entry(placement.RECORD_ASSIGNMENTS, "1")
    # only text models use its operators: others never load it
    library = extensions_library() if kind.text else None
    if library is not None:
        options.register_custom_ops_library(library)
    try:
        with native_stderr_filtered():
            session = ort.InferenceSession(str(edited or model_path), options,
                                           providers=wanted)
    except Exception as exc:  # onnxruntime raises its own types for bad protobufs and graphs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "ai.onnx.contrib" in str(exc) and extensions_library() is None:
            first = "it is a text model and needs `pip install onnxruntime-extensions`"
        raise PipelineError(f"cannot load model {model_path}: {first}") from None
    if CUDA in wanted and session.get_providers()[0] != CUDA:
        if choice == "cuda" or kind.weights == "fp16":
            raise PipelineError("provider cuda: ONNX Runtime could not start CUDA "
                                "(check the CUDA/cuDNN libraries; use cpu)")
    if choice == "cuda" and (kind.weights == "int8" or kind.text):
        warning = placement.fallback_warning(session, model_path.name)
        if warning:
            (warn or warn_stderr)(warning)
    return session


def open_batch_session(model_path: Path, choice: str, threads: int,
                       warn: Callable[[str], None] | None = None):
    """A session of the file without the BeamSearch operator beside its Loops, for batches
    (src/runtime/batch_graph.py); None for a file whose batches that operator searches."""
    return _open_cut(model_path, choice, threads, warn, batch_graph.pieces_without_operator,
                     ("batches go", "its batch search"))


def open_operator_session(model_path: Path, choice: str, threads: int,
                          warn: Callable[[str], None] | None = None):
    """A session of the file as its BeamSearch operator alone, each subgraph holding its
    weights, for one sentence and n-best lists (src/runtime/operator_graph.py); None for a
    file that is not so written, where the providers are not the CPU's alone, or where the
    temporary directory has no room (then the file's own session searches, slower)."""
    import onnxruntime as ort

    try:
        kind = placement.FileKind.of(placement.read_metadata(model_path))
        providers = placement.providers_for(choice, kind, ort.get_available_providers())
    except (PipelineError, OSError, ValueError):  # missing, unreadable, or no provider for
        return None  # it: opening the file itself says so, in one line
    if providers != [placement.CPU] or kind.text:  # measured on the CPU only (docs/engines.md);
        return None  # a text twin's search sits between its tokenizer nodes: never cut
    try:
        return _open_cut(model_path, choice, threads, warn, operator_graph.pieces_operator_only,
                         ("one sentence goes", "its search alone"))
    # unreadable, empty or malformed, or the cut refused: the file's own session says what
    # is wrong with the file, or searches as it always did
    except (OSError, ValueError, PipelineError):
        return None


def _open_cut(model_path: Path, choice: str, threads: int, warn: Callable[[str], None] | None,
              cut: Callable, names: tuple[str, str]):
    """A session of `cut`'s pieces of the mapped file (None: no cut for this file). They are
    written to a temporary file, a MiB at a time with `os.pread` (the copied pages never count
    in this process's memory), and opened by path: opened from bytes in memory, the session
    held much more memory (docs/engines.md, fifth round). No room there: a warning naming
    `names` (what goes through the file as written instead, what had no room) and None."""
    with open(model_path, "rb") as fh, \
            mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        pieces = cut(mapped)
        if pieces is None:
            return None
        with tempfile.TemporaryDirectory(prefix="nmt-cut-", ignore_cleanup_errors=True) as tmp:
            edited = Path(tmp, Path(model_path).name)
            try:
                with edited.open("wb") as out:
                    batch_graph.write_pieces(mapped, pieces, out, source=fh.fileno())
            except OSError as exc:  # a full or read-only temp dir: slower, not wrong
                (warn or warn_stderr)(f"{names[0]} through {Path(model_path).name} as "
                                      f"written (no room for {names[1]}: {exc.strerror})")
                return None
            return open_session(model_path, choice, threads, warn, edited=edited)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tokenizer_fingerprint(tokenizer_dir: Path, side: str) -> str:
    """What export records as `<side>_tokenizer_sha256` and `load_translator` checks."""
    return sha256(Path(tokenizer_dir) / f"{side}.model")


def tokenizer_metadata(tokenizer_dir: Path) -> dict[str, str]:
    return {f"{side}_tokenizer_sha256": tokenizer_fingerprint(tokenizer_dir, side)
            for side in ("source", "target")}


# -- text in, text out -------------------------------------------------------------------------
def warn_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def length_batches(lines: list[str], batch_size: int,
                   lengths: Mapping[int, int] | None = None) -> list[list[int]]:
    """Indices of the non-blank lines, shortest first (ties by position), cut into batches:
    by `lengths[i]` (source tokens: the generation model's translator, whose batches then hold
    little padding) or, without them, by characters (the text model tokenizes inside its
    graph). Whatever scores or compares a file uses the batches its translator makes, since
    int8 models quantize activations per batch: an int8 translation can change with the
    sentences that share its batch."""
    def size(i: int):
        return lengths[i] if lengths is not None else len(lines[i])

    order = sorted((i for i, line in enumerate(lines) if line.strip()),
                   key=lambda i: (size(i), i))
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def translate_in_batches(lines: list[str], batch_size: int, run: Callable[[list[int]], list],
                         lengths: Mapping[int, int] | None = None, blank="") -> list:
    """One output per line, in order, `blank` for blank lines; `run` translates a batch
    (indices) of `length_batches`."""
    if len(lines) == 1:  # one sentence (a request, a benchmark's batch 1): nothing to batch
        return list(run([0])) if lines[0].strip() else [blank]
    out = [blank] * len(lines)
    for idx in length_batches(lines, batch_size, lengths):
        for i, text in zip(idx, run(idx)):
            out[i] = text
    return out


@dataclass
class LoadedModel:
    """An ONNX Runtime session of one of our model files and its metadata."""

    session: object
    meta: dict[str, str]
    # opens the session for batches (`open_batch_session`); None: the translator's own session
    open_batch: Callable[[], object | None] | None = field(default=None, kw_only=True,
                                                          repr=False)
    _batch: list = field(default_factory=list, init=False, repr=False)  # [session] once opened

    def session_for(self, rows: int, n_best: int = 1):
        """The session that searches `rows` sentences for `n_best` hypotheses each: the
        translator's own for one sentence (the file's BeamSearch operator searches it; on the
        CPU the file opened as that operator alone, `open_operator_session`), for a batch the
        file without that operator where there is one (opened on the first batch), which
        spares each batch the operator's one-token dummy step. A batch's n-best lists too,
        where the file's Loop returns them (`N_BEST_BATCHES`); in older files only the
        operator does."""
        if rows < 2 or self.open_batch is None or (
                n_best > 1 and self.meta.get(N_BEST_BATCHES) != "loop"):
            return self.session
        return self.batch_session or self.session

    @property
    def batch_session(self):
        """The session for batches, opened once on first use (None: the file has no cut, or
        no room for it). The served model's requests come from a thread pool, hence the lock."""
        if not self._batch:
            with _OPENING:
                if not self._batch:
                    self._batch.append(self.open_batch())
        return self._batch[0]

    @property
    def default_beam(self) -> int:
        return int(self.meta["beam_size"])

    @property
    def source_piece_limit(self) -> int:
        """Source pieces the model reads: its limit less one place for the EOS."""
        return int(self.meta["max_source_tokens"]) - 1

    @property
    def provider(self) -> str:
        """The provider ONNX Runtime put first (it runs what it can)."""
        return self.session.get_providers()[0]

    @property
    def ran_on(self) -> str:
        """Which provider runs how many nodes (`placement.describe`)."""
        return placement.describe(self.session)

    @property
    def scored(self) -> bool:
        """Whether the file returns scores (files written before them do not)."""
        return has_scores(self.meta)

    def confidence(self, best: Scored) -> float | None:
        """The confidence of a line's best translation (src/runtime/confidence.py), from the
        calibration in the file's metadata; None without a score."""
        if best.score is None:
            return None
        feature = confidence.mean_logp(best.score, best.tokens,
                                       float(self.meta["length_penalty"]))
        return confidence.confidence(feature, self.calibration)

    @cached_property
    def calibration(self) -> confidence.Calibration | None:
        """The confidence curve in the file's metadata (read once, not per sentence)."""
        return confidence.from_metadata(self.meta)


@dataclass(frozen=True)
class Scored:
    """A translation with what the search says of it: its score (None from a file without
    scores) and its length as the score counts it (target tokens, EOS included unless the
    output limit cut it; None where unknown: a text model returns no ids)."""

    text: str
    score: float | None
    tokens: int | None


@dataclass
class Translator(LoadedModel):
    """A generation model (ids in, ids out) and the two SentencePiece models around it."""

    source: object  # sentencepiece.SentencePieceProcessor
    target: object
    warn: Callable[[str], None] = field(default=warn_stderr)

    @property
    def eos(self) -> int:
        return int(self.meta["eos_id"])

    @property
    def pad(self) -> int:
        return int(self.meta["pad_id"])

    def encode(self, text: str, line_no: int) -> list[int]:
        """Source ids + EOS, cut to the model's limit (with a warning)."""
        ids = self.source.encode(text)
        limit = self.source_piece_limit
        if len(ids) > limit:
            self.warn(f"line {line_no}: {len(ids)} tokens, truncated to the model's limit "
                      f"of {limit}")
            ids = ids[:limit]
        return ids + [self.eos]

    def new_tokens(self, longest_source: int, max_length: int | None) -> int:
        """`max_new_tokens` with the export's ratio, or `max_length`; never past the model."""
        limit = int(self.meta["max_output_tokens"])
        if max_length:
            return min(max_length, limit)
        return max_new_tokens(longest_source, float(self.meta["max_length_ratio"]), limit)

    def run(self, rows: list[list[int]], beam: int, max_length: int | None) -> list[str]:
        """Translate a batch of id rows; returns one string per row."""
        src = pad_rows(rows, self.pad)
        hyps = run_search(self.session_for(len(rows)), src,
                          self.new_tokens(src.shape[1], max_length), beam,
                          float(self.meta["length_penalty"]), self.pad)
        return decode_ids(self.target, hyps, self.eos)

    def run_scored(self, rows: list[list[int]], beam: int, max_length: int | None,
                   n_best: int = 1) -> list[tuple[Scored, ...]]:
        """`n_best` scored translations of each row of a batch, best first."""
        src = pad_rows(rows, self.pad)
        new_tokens = self.new_tokens(src.shape[1], max_length)
        found = run_search_scored(self.session_for(len(rows), n_best), src, new_tokens, beam,
                                  float(self.meta["length_penalty"]), self.pad, n_best,
                                  self.scored)
        # one decode_ids call for the batch: one per sentence cost nearly a third of the Python
        # that scores add to a batch (docs/serving.md)
        texts = iter(decode_ids(self.target, [h.ids for hyps in found for h in hyps], self.eos))
        return [tuple(Scored(next(texts), h.score, len(h.ids) + (len(h.ids) < new_tokens))
                      for h in hyps) for hyps in found]

    def translate(self, lines: list[str], beam: int | None = None,
                  max_length: int | None = None, batch_size: int = 32,
                  first_line_no: int = 1) -> list[str]:
        """One output per input line, in order; blank lines stay blank. Lines are sorted by
        source tokens into batches (`length_batches`: little padding), and the order is
        restored."""
        beam = beam or self.default_beam
        encoded = self.encode_lines(lines, first_line_no)
        return translate_in_batches(
            lines, batch_size, lambda idx: self.run([encoded[i] for i in idx], beam, max_length),
            {i: len(ids) for i, ids in encoded.items()})

    def translate_scored(self, lines: list[str], beam: int | None = None,
                         max_length: int | None = None, batch_size: int = 32,
                         first_line_no: int = 1, n_best: int = 1) -> list[tuple[Scored, ...]]:
        """As `translate`, each line's `n_best` translations with their scores (an empty
        tuple for a blank line); the same batches, so the first is `translate`'s line."""
        beam = beam or self.default_beam
        check_n_best(n_best, beam)
        encoded = self.encode_lines(lines, first_line_no)
        return translate_in_batches(
            lines, batch_size,
            lambda idx: self.run_scored([encoded[i] for i in idx], beam, max_length, n_best),
            {i: len(ids) for i, ids in encoded.items()}, blank=())

    def encode_lines(self, lines: list[str], first_line_no: int) -> dict[int, list[int]]:
        return {i: self.encode(line, first_line_no + i)
                for i, line in enumerate(lines) if line.strip()}


def check_n_best(n_best: int, beam: int) -> None:
    """An n-best list holds 1 to `beam` hypotheses (the search keeps no more)."""
    if not 1 <= n_best <= beam:
        raise PipelineError(f"n-best {n_best}: a search with beam {beam} returns 1 to {beam} "
                            "hypotheses (raise the beam for more)")


@dataclass
class TextTranslator(LoadedModel):
    """A text model (`TEXT_FORMAT`): strings in, strings out, the search settings of its
    export by default (its metadata says which; files with `TEXT_INPUTS` take another beam);
    no tokenizer files needed."""

    def run(self, lines: list[str], beam: int | None = None) -> list[str]:
        session = self.session_for(len(lines))
        feeds = {TEXT_INPUT: np.array(lines, dtype=object), **score_switch(session, False),
                 **self.search_feeds(beam)}
        return [str(t) for t in session.run([TEXT_OUTPUT], feeds)[0]]

    def run_scored(self, lines: list[str], n_best: int = 1,
                   beam: int | None = None) -> list[tuple[Scored, ...]]:
        """Each line's `n_best` translations with their scores (None from a file without
        scores), best first; their lengths are not known (the file returns text, not ids)."""
        session = self.session_for(len(lines), n_best)
        feeds = {TEXT_INPUT: np.array(lines, dtype=object),
                 **score_switch(session, self.scored), **self.search_feeds(beam, n_best)}
        names = ([TEXT_N_BEST_TEXTS, TEXT_N_BEST_SCORES] if self.has_n_best
                 else [TEXT_OUTPUT, TEXT_SCORE])  # files written before n-best lists
        outputs = session.run(names[:1 + self.scored], feeds)
        texts = np.asarray(outputs[0], dtype=object).reshape(len(lines), -1)
        scores = (np.asarray(outputs[1]).reshape(len(lines), -1) if self.scored
                  else np.full(texts.shape, None))
        return [tuple(Scored(str(t), None if s is None else float(s), None)
                      for t, s in zip(row_texts, row_scores))
                for row_texts, row_scores in zip(texts, scores)]

    def search_feeds(self, beam: int | None, n_best: int = 1) -> dict[str, np.ndarray]:
        """The optional search inputs this file takes, for `beam` (None: the export's) and
        `n_best`; none for a file written before them."""
        feeds = {}
        if beam is not None and "num_beams" in self.optional_inputs:
            feeds["num_beams"] = np.array([beam], np.int32)
        if self.has_n_best:
            feeds["num_return_sequences"] = np.array([n_best], np.int32)
        return feeds

    @property
    def optional_inputs(self) -> list[str]:
        """The search inputs the file takes beside `text`, each with the export's value as its
        default (metadata `TEXT_INPUTS`; none in files written before them)."""
        return [name for name in self.meta.get(TEXT_INPUTS, "").split(",") if name]

    @property
    def has_n_best(self) -> bool:
        """Whether the file returns n-best lists (its metadata `text_outputs` names them)."""
        return TEXT_N_BEST_TEXTS in self.meta.get(TEXT_OUTPUTS, "").split(",")

    def check_search(self, beam: int | None, max_length: int | None) -> None:
        """Refuse settings the file cannot honour: an output length (the file derives it from
        the source), and in files written before `num_beams` was an input, another beam."""
        fixed_beam = "num_beams" not in self.optional_inputs
        if max_length or (fixed_beam and beam not in (None, self.default_beam)):
            fixed = ((f"beam {self.default_beam}, ", "--beam/--max-length") if fixed_beam
                     else ("", "--max-length"))  # files with the input take another beam
            raise PipelineError(f"a text model searches as exported ({fixed[0]}output length "
                                f"by ratio {self.meta['max_length_ratio']}): use the "
                                f"generation model (model.onnx) for {fixed[1]}, or write a "
                                f"text model with other settings (python -m src.text_graph "
                                f"--help)")

    def check_n_best(self, n_best: int, beam: int | None = None) -> None:
        """Refuse an n-best list longer than the beam (None: the file's), or one from a file
        written before text models returned them."""
        check_n_best(n_best, beam or self.default_beam)
        if n_best > 1 and not self.has_n_best:
            raise PipelineError("this text model returns one translation per line (written "
                                "before n-best lists): use the generation model (model.onnx) "
                                "for --n-best, or write the text model again (python -m "
                                "src.text_graph --help)")

    @cached_property
    def source(self):
        """The source SentencePiece model from the metadata; None in a file written before
        it was there (whose batches then go by characters)."""
        encoded = self.meta.get(TEXT_SOURCE_TOKENIZER)
        if not encoded:
            return None
        import base64

        import sentencepiece as spm

        return spm.SentencePieceProcessor(model_proto=base64.b64decode(encoded))

    def source_lengths(self, lines: list[str]) -> dict[int, int] | None:
        """Source tokens of each non-blank line as `Translator.encode` counts them (EOS
        included, cut to the model's limit), or None without the tokenizer."""
        if self.source is None:
            return None
        return {i: min(len(self.source.encode(line)), self.source_piece_limit) + 1
                for i, line in enumerate(lines) if line.strip()}

    def translate(self, lines: list[str], beam: int | None = None,
                  max_length: int | None = None, batch_size: int = 32,
                  first_line_no: int = 1) -> list[str]:
        """As `Translator.translate` (the same batches); a source longer than the model's
        limit is cut inside the graph, silently."""
        self.check_search(beam, max_length)
        return translate_in_batches(lines, batch_size,
                                    lambda idx: self.run([lines[i] for i in idx], beam),
                                    self.source_lengths(lines))

    def translate_scored(self, lines: list[str], beam: int | None = None,
                         max_length: int | None = None, batch_size: int = 32,
                         first_line_no: int = 1, n_best: int = 1) -> list[tuple[Scored, ...]]:
        """As `translate`, each line's `n_best` translations with their scores."""
        self.check_search(beam, max_length)
        self.check_n_best(n_best, beam)
        return translate_in_batches(lines, batch_size,
                                    lambda idx: self.run_scored([lines[i] for i in idx], n_best,
                                                                beam),
                                    self.source_lengths(lines), blank=())


def load_translator(model_path: Path, tokenizer_dir: Path | None = None, provider: str = "auto",
                    threads: int | None = None,
                    warn: Callable[[str], None] = warn_stderr) -> Translator | TextTranslator:
    """The model file, and the tokenizer beside it (`tokenizer/`) or in `tokenizer_dir`,
    checked against the fingerprints recorded at export; a text model carries its own.
    `threads=None`: DEFAULT_THREADS."""
    model_path = Path(model_path)
    threads = threads or DEFAULT_THREADS
    session = (open_operator_session(model_path, provider, threads, warn)
               or open_session(model_path, provider, threads, warn))
    meta = session.get_modelmeta().custom_metadata_map
    # The operator's dummy step was measured on the CPU (docs/engines.md); on CUDA, unmeasured,
    # batches keep the file's own session.
    open_batch = (partial(open_batch_session, model_path, provider, threads, warn)
                  if session.get_providers()[0] == placement.CPU else None)
    if meta.get("format") == TEXT_FORMAT:
        if tokenizer_dir is not None:
            raise PipelineError(f"{model_path} is a text model with its tokenizer inside; "
                                f"drop --tokenizer")
        return TextTranslator(session, meta, open_batch=open_batch)
    if meta.get("format") != GRAPH_FORMAT:
        raise PipelineError(f"{model_path} is not a translation model written by src.export "
                            f"(metadata format {meta.get('format')!r}, expected {GRAPH_FORMAT})")
    return Translator(session, meta, *load_tokenizers_for(model_path, tokenizer_dir, meta),
                      warn=warn, open_batch=open_batch)


def load_tokenizers_for(model_path: Path, tokenizer_dir: Path | None,
                        meta: Mapping[str, str]) -> tuple:
    """The source and target SentencePiece models of a file: in `tokenizer_dir`, or in
    `tokenizer/` beside it, checked against the fingerprints its export recorded."""
    import sentencepiece as spm

    tokenizer_dir = Path(tokenizer_dir or Path(model_path).parent / "tokenizer")
    processors = []
    for side in ("source", "target"):
        path = tokenizer_dir / f"{side}.model"
        if not path.is_file():
            raise PipelineError(f"tokenizer not found: {path} (pass --tokenizer DIR)")
        if tokenizer_fingerprint(tokenizer_dir, side) != meta.get(f"{side}_tokenizer_sha256"):
            raise PipelineError(f"tokenizer {path} does not match the model (its sha256 differs "
                                f"from the one recorded at export): use the tokenizer exported "
                                f"with {Path(model_path).name}")
        processors.append(spm.SentencePieceProcessor(model_file=str(path)))
    return tuple(processors)
