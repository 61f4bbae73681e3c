"""infer: translate with models/model.onnx through ONNX Runtime alone (no torch, no training code).

    python -m src.infer --onnx models/model.onnx "How are you?"         # one sentence
    printf 'Hi.\\n\\nThanks!\\n' | python -m src.infer --onnx models/model.onnx   # stdin, per line
    python -m src.infer --onnx models/model.onnx --input en.txt --output zh.txt   # batched

Reads the model's metadata_props (special ids, limits, default beam, tokenizer fingerprints;
the contract is written by src/onnx_graph.py and src/export.py, and tests/test_export.py checks
both ends agree) and the SentencePiece models in `tokenizer/` beside the model, or --tokenizer.
Writes one output line per input line (empty lines stay empty) to stdout or --output; warnings
and the provider that ran go to stderr. Deployment needs onnxruntime, numpy, sentencepiece and
typer only.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import typer

from src.atomic import write_text
from src.errors import PipelineError, run_cli
from src.text import iter_lines, read_lines

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)

GRAPH_FORMAT = "nmt-beamsearch-1"  # src.onnx_graph.GRAPH_FORMAT of the files we can run
# 1 vs 2 threads on the 2-core dev machine (default model, 256/1024 test sentences, 3 runs each,
# sent/s): greedy batch 1 a tie (169-183 vs 161-200); beam 4 batch 1 93-103 vs 100-132;
# greedy batch 32 679-698 vs 657-909; beam 4 batch 32 216-270 vs 321-327. So 2.
DEFAULT_THREADS = 2
CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
MAX_BEAM = 128  # ONNX Runtime's BeamSearch refuses larger beams inside session.run


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gpu_present() -> bool:
    """A CUDA device node exists (Linux); elsewhere let the session tell."""
    if sys.platform != "linux":
        return True
    return any(Path("/dev").glob("nvidia[0-9]*"))


def providers_for(choice: str) -> list[str]:
    """The providers to ask for. `auto` asks for CUDA only where it can work: with
    onnxruntime-gpu and no GPU, asking logs loud errors before falling back to the CPU."""
    import onnxruntime as ort

    cuda_ok = CUDA in ort.get_available_providers() and gpu_present()
    if choice == "cuda" and not cuda_ok:
        why = "this onnxruntime has no CUDA provider" if CUDA not in \
            ort.get_available_providers() else "no NVIDIA GPU found"
        raise PipelineError(f"--provider cuda is not available: {why} (use --provider cpu)")
    return [CUDA, CPU] if cuda_ok and choice in {"auto", "cuda"} else [CPU]


def open_session(model_path: Path, choice: str, threads: int):
    import onnxruntime as ort

    if not model_path.is_file():
        raise PipelineError(f"model not found: {model_path} (run `dvc repro export`)")
    wanted = providers_for(choice)
    # Where CUDA cannot start, ORT logs errors before falling back; we say it in one line.
    severity = 4 if CUDA in wanted else 3
    ort.set_default_logger_severity(severity)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = severity
    try:
        session = ort.InferenceSession(str(model_path), options, providers=wanted)
    except Exception as exc:  # onnxruntime raises its own types for bad protobufs and graphs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipelineError(f"cannot load model {model_path}: {first}") from None
    if choice == "cuda" and session.get_providers()[0] != CUDA:
        raise PipelineError("--provider cuda: ONNX Runtime could not start CUDA "
                            "(check the CUDA/cuDNN libraries; use --provider cpu)")
    return session


@dataclass
class Translator:
    """An ONNX generation session, its metadata and the two SentencePiece models."""

    session: object
    meta: dict[str, str]
    source: object  # sentencepiece.SentencePieceProcessor
    target: object

    @property
    def eos(self) -> int:
        return int(self.meta["eos_id"])

    @property
    def pad(self) -> int:
        return int(self.meta["pad_id"])

    def encode(self, text: str, line_no: int) -> list[int]:
        """Source ids + EOS, cut to the model's limit (with a warning on stderr)."""
        ids = self.source.encode(text)
        limit = int(self.meta["max_source_tokens"]) - 1  # room for the EOS
        if len(ids) > limit:
            warn(f"line {line_no}: {len(ids)} tokens, truncated to the model's limit of {limit}")
            ids = ids[:limit]
        return ids + [self.eos]

    def max_new_tokens(self, longest_source: int, max_length: int | None) -> int:
        """The rule of src.search.max_output_length, or --max-length; never past the model."""
        limit = int(self.meta["max_output_tokens"])
        if max_length is not None:
            return min(max_length, limit)
        return min(int(float(self.meta["max_length_ratio"]) * longest_source) + 10, limit)

    def run(self, rows: list[list[int]], beam: int, max_length: int | None) -> list[str]:
        """Translate a batch of id rows; returns one string per row."""
        width = max(len(r) for r in rows)
        src = np.full((len(rows), width), self.pad, dtype=np.int32)  # (B, S), right-padded
        for i, row in enumerate(rows):
            src[i, : len(row)] = row
        feeds = {
            "input_ids": src,
            "max_length": np.array([self.max_new_tokens(width, max_length) + 1], np.int32),
            "min_length": np.array([0], np.int32),
            "num_beams": np.array([beam], np.int32),
            "num_return_sequences": np.array([1], np.int32),
            "length_penalty": np.array([float(self.meta["length_penalty"])], np.float32),
            "repetition_penalty": np.array([1.0], np.float32),
        }
        sequences = self.session.run(None, feeds)[0]  # (B, 1, T): BOS, tokens, PAD...
        return [self.target.decode([int(t) for t in row[0, 1:] if t > self.eos])
                for row in sequences]

    def translate(self, lines: list[str], beam: int, max_length: int | None,
                  batch_size: int, first_line_no: int = 1) -> list[str]:
        """One output per input line, in order; blank lines stay blank."""
        out = [""] * len(lines)
        encoded = {i: self.encode(line, first_line_no + i)
                   for i, line in enumerate(lines) if line.strip()}
        order = sorted(encoded, key=lambda i: len(encoded[i]))  # similar lengths pad little
        for start in range(0, len(order), batch_size):
            idx = order[start: start + batch_size]
            for i, text in zip(idx, self.run([encoded[i] for i in idx], beam, max_length)):
                out[i] = text
        return out


def load_translator(model_path: Path, tokenizer_dir: Path | None, provider: str,
                    threads: int) -> Translator:
    import sentencepiece as spm

    session = open_session(model_path, provider, threads)
    meta = session.get_modelmeta().custom_metadata_map
    if meta.get("format") != GRAPH_FORMAT:
        raise PipelineError(f"{model_path} is not a translation model written by src.export "
                            f"(metadata format {meta.get('format')!r}, expected {GRAPH_FORMAT})")
    tokenizer_dir = tokenizer_dir or model_path.parent / "tokenizer"
    processors = []
    for side in ("source", "target"):
        path = tokenizer_dir / f"{side}.model"
        if not path.is_file():
            raise PipelineError(f"tokenizer not found: {path} (pass --tokenizer DIR)")
        if sha256(path) != meta.get(f"{side}_tokenizer_sha256"):
            raise PipelineError(f"tokenizer {path} does not match the model (its sha256 differs "
                                f"from the one recorded at export): use the tokenizer exported "
                                f"with {model_path.name}")
        processors.append(spm.SentencePieceProcessor(model_file=str(path)))
    ran = session.get_providers()[0]
    print(f"infer: {ran}" + (f", {threads} threads" if ran == CPU else ""), file=sys.stderr)
    return Translator(session, meta, *processors)


def stdin_lines():
    """Lines of stdin, decoded strictly as UTF-8 (an error names the line and byte offset)."""
    return iter_lines(sys.stdin.buffer, "<stdin>")


@app.command()
def main(
    text: str = typer.Argument(None, help="Sentence to translate; '-' or none reads stdin."),
    onnx: Path = typer.Option(Path("models/model.onnx"), help="Model written by src.export."),
    tokenizer: Path = typer.Option(None, help="Tokenizer dir (default: tokenizer/ beside it)."),
    input_file: Path = typer.Option(None, "--input", help="Translate this file, in batches."),
    output_file: Path = typer.Option(None, "--output", help="Write translations here."),
    beam: int = typer.Option(None, min=1, max=MAX_BEAM,
                             help="Beam size (default: the export's); 1 = greedy."),
    max_length: int = typer.Option(None, min=1, help="Max output tokens (default: as export)."),
    batch_size: int = typer.Option(32, min=1, help="Sentences per session.run (--input)."),
    provider: str = typer.Option("auto", help="auto (CUDA if it really runs), cuda or cpu."),
    threads: int = typer.Option(DEFAULT_THREADS, min=1, help="CPU threads of ONNX Runtime."),
) -> None:
    """Translate English text with the single-file ONNX model (the search runs in the graph)."""
    if provider not in {"auto", "cuda", "cpu"}:
        raise PipelineError(f"--provider must be auto, cuda or cpu, not {provider!r}")
    from_stdin = text in (None, "-")
    if not from_stdin and input_file is not None:
        raise PipelineError("give either a sentence or --input FILE, not both")
    if input_file is not None and not input_file.is_file():
        raise PipelineError(f"input file not found: {input_file}")
    translator = load_translator(onnx, tokenizer, provider, threads)
    beam = beam or int(translator.meta["beam_size"])
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
