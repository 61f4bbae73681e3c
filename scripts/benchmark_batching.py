"""Batches sorted by characters against batches sorted by source tokens, our files alone.

    python scripts/benchmark_batching.py --models models --threads 1

Cuts the test split into batches of `--batch` both ways (`generation.length_batches` without
and with token counts), prints each way's share of padding, then times the generation model
on each (beams 1 and 4, int8 and fp32, the two ways alternating, `--repeats` passes, the
fastest counts). Not a test: timings need an otherwise idle machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from src.core import paths  # noqa: E402

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    models: Path = typer.Option(paths.MODELS, help="model.onnx, model.int8.onnx, tokenizer/."),
    split_dir: Path = typer.Option(paths.TOKENIZED, help="The stored splits (test)."),
    batch: int = typer.Option(32, min=2),
    threads: int = typer.Option(1, min=1),
    repeats: int = typer.Option(3, min=1),
) -> None:
    """Print the padding share and sentences/s of both ways of batching."""
    from datasets import load_from_disk

    from src.runtime.generation import length_batches, load_translator

    lines = [s for s in load_from_disk(str(split_dir))["test"]["source"] if s.strip()]
    for name in ("model.int8.onnx", "model.onnx"):
        translator = load_translator(models / name, threads=threads, warn=lambda _: None)
        encoded = [translator.encode(line, i + 1) for i, line in enumerate(lines)]
        ways = {"characters": length_batches(lines, batch),
                "tokens": length_batches(lines, batch, {i: len(e) for i, e in enumerate(encoded)})}
        for way, batches in ways.items():
            cells = sum(max(len(encoded[i]) for i in b) * len(b) for b in batches)
            padding = 1 - sum(map(len, encoded)) / cells
            print(f"{name}: by {way}, {len(batches)} batches, padding {padding:.1%}")
        for beam in (1, 4):
            best = dict.fromkeys(ways, float("inf"))
            for _ in range(repeats):
                for way, batches in ways.items():
                    start = time.perf_counter()
                    for b in batches:
                        translator.run([encoded[i] for i in b], beam, None)
                    best[way] = min(best[way], time.perf_counter() - start)
            print(f"{name}: beam {beam}, {threads} thread(s), sentences/s: " + ", ".join(
                f"by {way} {len(lines) / seconds:.1f}" for way, seconds in best.items()),
                flush=True)


if __name__ == "__main__":
    app()
