"""The translators: a model file's session with its metadata and tokenizers, turning lines of
text into translations (and scored n-best lists) in length-sorted batches. `load_translator`
opens a file of ours, generation model (`Translator`) or text model (`TextTranslator`), and
checks its tokenizer. numpy, onnxruntime and sentencepiece only (no torch): `src.infer`, the
MLflow model, the benchmarks and export's checks all translate through here.

The contract these classes feed is src/runtime/contract.py; the sessions come from
src/runtime/sessions.py, the batches from src/runtime/length_batches.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

import numpy as np

from src.core.errors import PipelineError
from src.data.subword import decode_ids
from src.runtime import confidence, placement
from src.runtime.contract import (
    GRAPH_FORMAT,
    TEXT_FORMAT,
    TEXT_INPUT,
    TEXT_N_BEST_SCORES,
    TEXT_N_BEST_TEXTS,
    TEXT_OUTPUT,
    TEXT_SOURCE_TOKENIZER,
    check_format,
    max_new_tokens,
    pad_rows,
    run_search,
    run_search_scored,
    score_switch,
)
from src.runtime.length_batches import translate_in_batches
from src.runtime.sessions import (
    DEFAULT_THREADS,
    open_batch_session,
    open_operator_session,
    open_session,
    tokenizer_fingerprint,
    warn_stderr,
)

_OPENING = threading.Lock()  # opens a model's batch session once, whichever thread asks first


@dataclass
class LoadedModel:
    """An ONNX Runtime session of one of our model files and its metadata."""

    session: object
    meta: dict[str, str]
    # opens the session for batches (`open_batch_session`); None: the translator's own session
    open_batch: Callable[[], object | None] | None = field(default=None, kw_only=True,
                                                          repr=False)
    _batch: list = field(default_factory=list, init=False, repr=False)  # [session] once opened

    def session_for(self, rows: int):
        """The session that searches `rows` sentences for `n_best` hypotheses each: the
        translator's own for one sentence (the file's BeamSearch operator searches it; on the
        CPU the file opened as that operator alone, `open_operator_session`), for a batch the
        file without that operator where there is one (opened on the first batch), which
        spares each batch the operator's one-token dummy step (n-best lists too: the Loop
        returns them)."""
        if rows < 2 or self.open_batch is None:
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

    def confidence(self, best: Scored) -> float | None:
        """The confidence of a line's best translation (src/runtime/confidence.py), from the
        calibration in the file's metadata; None without one."""
        feature = confidence.mean_logp(best.score, best.tokens,
                                       float(self.meta["length_penalty"]))
        return confidence.confidence(feature, self.calibration)

    @cached_property
    def calibration(self) -> confidence.Calibration | None:
        """The confidence curve in the file's metadata (read once, not per sentence)."""
        return confidence.from_metadata(self.meta)


@dataclass(frozen=True)
class Scored:
    """A translation with what the search says of it: its score and its length as the score
    counts it (target tokens, EOS included unless the output limit cut it; None where unknown:
    a text model returns no ids)."""

    text: str
    score: float
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
        found = run_search_scored(self.session_for(len(rows)), src, new_tokens, beam,
                                  float(self.meta["length_penalty"]), self.pad, n_best)
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
    export unless a call names another beam; no tokenizer files needed."""

    def run(self, lines: list[str], beam: int | None = None) -> list[str]:
        feeds = {TEXT_INPUT: np.array(lines, dtype=object), **score_switch(False),
                 **self.search_feeds(beam)}
        return [str(t) for t in self.session_for(len(lines)).run([TEXT_OUTPUT], feeds)[0]]

    def run_scored(self, lines: list[str], n_best: int = 1,
                   beam: int | None = None) -> list[tuple[Scored, ...]]:
        """Each line's `n_best` translations with their scores, best first; their lengths are
        not known (the file returns text, not ids)."""
        feeds = {TEXT_INPUT: np.array(lines, dtype=object), **score_switch(True),
                 **self.search_feeds(beam, n_best)}
        outputs = self.session_for(len(lines)).run([TEXT_N_BEST_TEXTS, TEXT_N_BEST_SCORES],
                                                   feeds)
        # ONNX Runtime returns strings as object arrays, and numpy reads -2 as -1: pragma: no
        # mutate on these lines
        texts = np.asarray(outputs[0], dtype=object).reshape(len(lines), -1)  # pragma: no mutate
        scores = np.asarray(outputs[1]).reshape(len(lines), -1)  # pragma: no mutate
        return [tuple(Scored(str(t), float(s), None) for t, s in zip(row_texts, row_scores))
                for row_texts, row_scores in zip(texts, scores)]

    @staticmethod
    def search_feeds(beam: int | None, n_best: int = 1) -> dict[str, np.ndarray]:
        """The optional search inputs for `beam` (None: the export's, the input's default)
        and `n_best`."""
        feeds = {"num_return_sequences": np.array([n_best], np.int32)}
        if beam is not None:
            feeds["num_beams"] = np.array([beam], np.int32)
        return feeds

    def check_search(self, max_length: int | None) -> None:
        """Refuse an output length: the file derives it from the source."""
        if max_length:
            raise PipelineError(f"a text model searches as exported (output length by ratio "
                                f"{self.meta['max_length_ratio']}): use the generation model "
                                f"(model.onnx) for --max-length, or write a text model with "
                                f"other settings (python -m src.text_graph --help)")

    @cached_property
    def source(self):
        """The source SentencePiece model from the metadata."""
        import base64

        import sentencepiece as spm

        return spm.SentencePieceProcessor(
            model_proto=base64.b64decode(self.meta[TEXT_SOURCE_TOKENIZER]))

    def source_lengths(self, lines: list[str]) -> dict[int, int]:
        """Source tokens of each non-blank line as `Translator.encode` counts them (EOS
        included, cut to the model's limit)."""
        return {i: min(len(self.source.encode(line)), self.source_piece_limit) + 1
                for i, line in enumerate(lines) if line.strip()}

    def translate(self, lines: list[str], beam: int | None = None,
                  max_length: int | None = None, batch_size: int = 32,
                  first_line_no: int = 1,  # pragma: no mutate (unused: nothing to warn of)
                  ) -> list[str]:
        """As `Translator.translate` (the same batches); a source longer than the model's
        limit is cut inside the graph, silently."""
        self.check_search(max_length)
        return translate_in_batches(lines, batch_size,
                                    lambda idx: self.run([lines[i] for i in idx], beam),
                                    self.source_lengths(lines))

    def translate_scored(self, lines: list[str], beam: int | None = None,
                         max_length: int | None = None, batch_size: int = 32,
                         first_line_no: int = 1,  # pragma: no mutate (unused here)
                         n_best: int = 1) -> list[tuple[Scored, ...]]:
        """As `translate`, each line's `n_best` translations with their scores."""
        self.check_search(max_length)
        check_n_best(n_best, beam or self.default_beam)
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
    if check_format(meta, model_path, (GRAPH_FORMAT, TEXT_FORMAT)) == TEXT_FORMAT:
        if tokenizer_dir is not None:
            raise PipelineError(f"{model_path} is a text model with its tokenizer inside; "
                                f"drop --tokenizer")
        return TextTranslator(session, meta, open_batch=open_batch)
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
