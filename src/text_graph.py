"""text_graph: write a text-in, text-out twin of an exported model with other default search
settings (the library is src/graph/text_twin.py; export writes the default twins itself)."""

from __future__ import annotations

from pathlib import Path

import typer

from src.core.atomic import atomic_path
from src.core.cli import run_cli
from src.runtime.contract import MAX_BEAM

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    onnx_path: Path = typer.Argument(..., help="Generation model written by src.export."),
    output: Path = typer.Option(..., help="Text model to write."),
    tokenizer: Path = typer.Option(None, help="Tokenizer dir (default: tokenizer/ beside it)."),
    beam: int = typer.Option(None, min=1, max=MAX_BEAM,
                             help="The twin's default beam (default: the export's)."),
    length_penalty: float = typer.Option(None, min=0.0,
                                         help="The twin's default (default: the export's)."),
) -> None:
    """Write a text-in, text-out twin of a generation model, e.g. a greedy one:
    python -m src.text_graph models/model.int8.onnx --beam 1 --output greedy.text.onnx
    (a client may still pass another beam or length penalty: the file's optional inputs)"""
    from src.graph.text_twin import wrap_file  # onnx: seconds to import, not for --help

    with atomic_path(output) as tmp:
        wrap_file(onnx_path, tokenizer or onnx_path.parent / "tokenizer", tmp, beam,
                  length_penalty)
    print(f"text_graph: wrote {output}")


if __name__ == "__main__":
    run_cli(app)
