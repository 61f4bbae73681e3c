"""Scoring given translations with the scoring file (src/graph/likelihood_graph.py): numpy,
onnxruntime and sentencepiece only, as src.infer. A pair is scored in batches of similar
length; its log-probability is the sum of its target tokens' (EOS included), its mean the
same per token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.core.errors import PipelineError
from src.runtime import contract, generation, sessions

SCORE_FORMAT = "nmt-score-1"  # metadata `format` of the scoring file
SCORE_INPUTS = ("source_ids", "target_ids")
SCORE_OUTPUT = "token_logprobs"


@dataclass(frozen=True)
class PairScore:
    logprob: float  # sum over the target's tokens, EOS included
    tokens: int  # target tokens scored, EOS included
    token_logprobs: tuple[float, ...]
    pieces: tuple[str, ...]  # the target's SentencePiece pieces, then "</s>"

    @property
    def mean_logprob(self) -> float:
        return self.logprob / self.tokens


@dataclass
class PairScorer(generation.LoadedModel):
    source: object  # sentencepiece.SentencePieceProcessor
    target: object
    warn: Callable[[str], None] = sessions.warn_stderr

    def ids(self, processor, text: str, limit: int, what: str, line_no: int) -> list[int]:
        ids = processor.encode(text)
        if len(ids) > limit:
            self.warn(f"line {line_no}: the {what} has {len(ids)} tokens, cut to the model's "
                      f"limit of {limit} (its score covers those only)")
            ids = ids[:limit]
        return ids + [int(self.meta["eos_id"])]

    def score(self, pairs: list[tuple[str, str]], batch_size: int = 32,
              first_line_no: int = 1) -> list[PairScore]:
        """Each (source, target)'s score, in order."""
        pad = int(self.meta["pad_id"])
        source_limit = int(self.meta["max_source_tokens"]) - 1
        target_limit = int(self.meta["max_output_tokens"]) - 1
        encoded = [(self.ids(self.source, s, source_limit, "source", first_line_no + i),
                    self.ids(self.target, t, target_limit, "target", first_line_no + i))
                   for i, (s, t) in enumerate(pairs)]
        out: list[PairScore | None] = [None] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: (len(encoded[i][1]), i))
        for start in range(0, len(order), batch_size):
            idx = order[start: start + batch_size]
            feeds = {SCORE_INPUTS[0]: contract.pad_rows([encoded[i][0] for i in idx], pad),
                     SCORE_INPUTS[1]: contract.pad_rows([encoded[i][1] for i in idx], pad)}
            logprobs = self.session.run([SCORE_OUTPUT], feeds)[0]
            for row, i in enumerate(idx):
                target = encoded[i][1]
                values = tuple(float(v) for v in logprobs[row, : len(target)])
                pieces = tuple(self.target.id_to_piece(t) for t in target[:-1]) + ("</s>",)
                out[i] = PairScore(float(np.sum(values)), len(target), values, pieces)
        return out


def load_scorer(model_path: Path, tokenizer_dir: Path | None = None, threads: int | None = None,
                warn: Callable[[str], None] = sessions.warn_stderr) -> PairScorer:
    """The scoring file on the CPU and the tokenizer beside it (or `tokenizer_dir`), checked
    against the fingerprints recorded at export."""
    model_path = Path(model_path)
    session = sessions.open_session(model_path, "cpu", threads or sessions.DEFAULT_THREADS,
                                    warn)
    meta = session.get_modelmeta().custom_metadata_map
    if meta.get("format") != SCORE_FORMAT:
        raise PipelineError(f"{model_path} is not a scoring model written by src.export "
                            f"(metadata format {meta.get('format')!r}, expected {SCORE_FORMAT}; "
                            "it is models/model.score.onnx)")
    source, target = generation.load_tokenizers_for(model_path, tokenizer_dir, meta)
    return PairScorer(session, meta, source, target, warn)
