"""infer: translate with models/model.onnx through ONNX Runtime alone (no torch, no training code).

    python -m src.infer --onnx models/model.onnx "How are you?"         # one sentence
    printf 'Hi.\\n\\nThanks!\\n' | python -m src.infer --onnx models/model.onnx   # stdin, per line
    python -m src.infer --onnx models/model.onnx --input en.txt --output zh.txt   # batched
    python -m src.infer --n-best 4 --format jsonl "How are you?"   # 4 hypotheses, scored

A text model (models/model.text.onnx, SentencePiece inside the graph) needs no tokenizer dir;
its output length follows the export's ratio (no --max-length). A file written by an older
export (another metadata `format`) is refused: export it again.

Reads the model's metadata_props (special ids, limits, default beam, tokenizer fingerprints;
the contract lives in src/runtime/contract.py, shared with export, the MLflow model and the
benchmarks) and the SentencePiece models in `tokenizer/` beside the model, or --tokenizer.
Writes one output line per input line (empty lines stay empty) to stdout or --output; warnings
and the provider that ran go to stderr. With --scores or --n-best, `--format tsv` (the default
then) writes a row per hypothesis: input line number, rank, score, the line's confidence,
translation; `--format jsonl` an object per input line: its line number, source, hypotheses
(text, score, tokens) and confidence (src/runtime/confidence.py). Deployment needs
onnxruntime, numpy, sentencepiece and typer only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from src.core.atomic import write_text
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.core.text import iter_lines, read_lines
from src.runtime.contract import MAX_BEAM
from src.runtime.generation import (
    Scored,
    TextTranslator,
    Translator,
    check_n_best,
    load_translator,
)
from src.runtime.placement import CPU
from src.runtime.sessions import DEFAULT_THREADS

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def open_translator(onnx: Path, tokenizer: Path | None, provider: str, threads: int,
                    beam: int | None, max_length: int | None,
                    n_best: int = 1) -> Translator | TextTranslator:
    """The translator, with the provider that ran said on stderr; a text model (strings in,
    strings out) derives the output length itself, and an n-best list holds at most the
    beam."""
    translator = load_translator(onnx, tokenizer, provider, threads)
    if isinstance(translator, TextTranslator):
        translator.check_search(max_length)
    check_n_best(n_best, beam or translator.default_beam)
    on_cpu = translator.provider == CPU
    print(f"infer: {translator.ran_on}"
          + (f", {threads} thread{'s' * (threads > 1)}" if on_cpu else ""),
          file=sys.stderr)
    return translator


FORMATS = ("text", "tsv", "jsonl")


def output_format(fmt: str | None, scores: bool, n_best: int) -> str:
    """The format asked for, or the default: text, tsv when scores or an n-best list are."""
    if fmt is None:
        return "tsv" if scores or n_best > 1 else "text"
    if fmt not in FORMATS:
        raise PipelineError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt == "text" and (scores or n_best > 1):
        raise PipelineError("--format text writes translations only: use --format tsv or "
                            "jsonl for --scores and --n-best")
    return fmt


def formatted(fmt: str, line_no: int, source: str, found: tuple[Scored, ...],
              translator: Translator | TextTranslator) -> list[str]:
    """The output lines of one input line (`found`: its hypotheses, best first; empty for a
    blank line)."""
    if fmt == "text":
        return [found[0].text if found else ""]
    conf = translator.confidence(found[0]) if found else None
    if fmt == "tsv":
        return [f"{line_no}\t{rank}\t{_number(hyp.score)}\t{_number(conf)}\t{hyp.text}"
                for rank, hyp in enumerate(found, start=1)]
    record = {"line": line_no, "source": source,
              "hypotheses": [{"text": h.text, "score": _rounded(h.score), "tokens": h.tokens}
                             for h in found],
              "confidence": _rounded(conf)}
    return [json.dumps(record, ensure_ascii=False)]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def stdin_lines():
    """Lines of stdin, decoded strictly as UTF-8 (an error names the line and byte offset)."""
    return iter_lines(sys.stdin.buffer, "<stdin>")


@app.command()
def main(
    text: str = typer.Argument(None, help="Sentence to translate; '-' or none reads stdin."),
    onnx: Path = typer.Option(Path("models/model.onnx"),
                              help="Model written by src.export: model.onnx, model.int8.onnx "
                                   "(CPU), model.fp16.onnx (CUDA only) or the text twins "
                                   "(*.text.onnx)."),
    tokenizer: Path = typer.Option(None, help="Tokenizer dir (default: tokenizer/ beside it)."),
    input_file: Path = typer.Option(None, "--input", help="Translate this file, in batches."),
    output_file: Path = typer.Option(None, "--output", help="Write translations here."),
    beam: int = typer.Option(None, min=1, max=MAX_BEAM,
                             help="Beam size (default: the export's); 1 = greedy."),
    max_length: int = typer.Option(None, min=1, help="Max output tokens (default: as export)."),
    batch_size: int = typer.Option(32, min=1, help="Sentences per session.run (--input)."),
    provider: str = typer.Option("auto", help="auto: CUDA if it really runs, for model.onnx "
                                 "and model.fp16.onnx; int8 and text files on the CPU. cuda "
                                 "forces it, cpu avoids it. Where each node ran is printed."),
    threads: int = typer.Option(DEFAULT_THREADS, min=1,
                                help="CPU threads of ONNX Runtime, whatever the model kind."),
    n_best: int = typer.Option(1, "--n-best", min=1, max=MAX_BEAM,
                               help="Hypotheses per line, best first (at most the beam)."),
    scores: bool = typer.Option(False, "--scores",
                                help="Write each translation's score (sum of log-probabilities "
                                     "/ length**length_penalty) and the line's confidence."),
    fmt: str = typer.Option(None, "--format",
                            help="text: translations only (the default); tsv: line, rank, "
                                 "score, confidence, translation (the default with --scores "
                                 "or --n-best); jsonl: one JSON object per input line."),
) -> None:
    """Translate English text with the single-file ONNX model (the search runs in the graph)."""
    if provider not in {"auto", "cuda", "cpu"}:
        raise PipelineError(f"--provider must be auto, cuda or cpu, not {provider!r}")
    fmt = output_format(fmt, scores, n_best)
    from_stdin = text in (None, "-")
    if not from_stdin and input_file is not None:
        raise PipelineError("give either a sentence or --input FILE, not both")
    if input_file is not None and not input_file.is_file():
        raise PipelineError(f"input file not found: {input_file}")
    translator = open_translator(onnx, tokenizer, provider, threads, beam, max_length,
                                 n_best=n_best)
    beam = beam or translator.default_beam

    def translated(lines: list[str], size: int, first_line_no: int = 1) -> list[str]:
        if fmt == "text":
            return translator.translate(lines, beam, max_length, size, first_line_no)
        found = translator.translate_scored(lines, beam, max_length, size, first_line_no,
                                            n_best)
        return [row for i, (line, hyps) in enumerate(zip(lines, found))
                for row in formatted(fmt, first_line_no + i, line, hyps, translator)]

    if input_file is not None:
        results = translated(list(read_lines(input_file)), batch_size)
    elif not from_stdin:
        results = translated([text], 1)
    elif output_file is not None:
        results = translated(list(stdin_lines()), batch_size)
    else:  # interactive: each line is answered as soon as it is read
        for line_no, line in enumerate(stdin_lines(), start=1):
            rows = translated([line], 1, line_no)
            if rows:  # a blank line has no tsv row
                print("\n".join(rows), flush=True)
        return
    if output_file is not None:
        write_text(output_file, "".join(r + "\n" for r in results))
    else:
        sys.stdout.writelines(r + "\n" for r in results)


if __name__ == "__main__":
    run_cli(app)
