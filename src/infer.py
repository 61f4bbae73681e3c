"""infer: translate with models/model.onnx through ONNX Runtime alone (no torch, no training code).

    python -m src.infer --onnx models/model.onnx "How are you?"         # one sentence
    printf 'Hi.\\n\\nThanks!\\n' | python -m src.infer --onnx models/model.onnx   # stdin, per line
    python -m src.infer --onnx models/model.onnx --input en.txt --output zh.txt   # batched

A text model (models/model.text.onnx, SentencePiece inside the graph) needs no tokenizer dir
and searches as it was exported.

Reads the model's metadata_props (special ids, limits, default beam, tokenizer fingerprints;
the contract lives in src/generation.py, shared with export, the MLflow model and the
benchmarks) and the SentencePiece models in `tokenizer/` beside the model, or --tokenizer.
Writes one output line per input line (empty lines stay empty) to stdout or --output; warnings
and the provider that ran go to stderr. Deployment needs onnxruntime, numpy, sentencepiece and
typer only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from src.core.atomic import write_text
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.core.text import iter_lines, read_lines
from src.runtime.generation import (
    DEFAULT_THREADS,
    MAX_BEAM,
    TextTranslator,
    Translator,
    load_translator,
)
from src.runtime.placement import CPU

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def open_translator(onnx: Path, tokenizer: Path | None, provider: str, threads: int,
                    beam: int | None, max_length: int | None) -> Translator | TextTranslator:
    """The translator, with the provider that ran said on stderr; a text model (strings in,
    strings out) must be asked for the search it was written with."""
    translator = load_translator(onnx, tokenizer, provider, threads)
    if isinstance(translator, TextTranslator):
        translator.check_search(beam, max_length)
    on_cpu = translator.provider == CPU
    print(f"infer: {translator.ran_on}"
          + (f", {threads} thread{'s' * (threads > 1)}" if on_cpu else ""),
          file=sys.stderr)
    return translator


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
) -> None:
    """Translate English text with the single-file ONNX model (the search runs in the graph)."""
    if provider not in {"auto", "cuda", "cpu"}:
        raise PipelineError(f"--provider must be auto, cuda or cpu, not {provider!r}")
    from_stdin = text in (None, "-")
    if not from_stdin and input_file is not None:
        raise PipelineError("give either a sentence or --input FILE, not both")
    if input_file is not None and not input_file.is_file():
        raise PipelineError(f"input file not found: {input_file}")
    translator = open_translator(onnx, tokenizer, provider, threads, beam, max_length)
    beam = beam or translator.default_beam
    if input_file is not None:
        lines = list(read_lines(input_file))
        results = translator.translate(lines, beam, max_length, batch_size)
    elif not from_stdin:
        results = translator.translate([text], beam, max_length, 1)
    elif output_file is not None:
        results = translator.translate(list(stdin_lines()), beam, max_length, batch_size)
    else:  # interactive: each line is answered as soon as it is read
        for line_no, line in enumerate(stdin_lines(), start=1):
            print(translator.translate([line], beam, max_length, 1, line_no)[0], flush=True)
        return
    if output_file is not None:
        write_text(output_file, "".join(r + "\n" for r in results))
    else:
        sys.stdout.writelines(r + "\n" for r in results)


if __name__ == "__main__":
    run_cli(app)
