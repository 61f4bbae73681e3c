"""A/B speed of two or more exports of our model: the same test sentences through each file,
files alternating pass by pass, each against the first as the median of rounds' ratios, and
the share of identical translations: docs/engines.md.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import typer

from bench.common import cli_app, ints, run_cli, same_share, test_split, timed
from src.core import paths
from src.runtime import generation

FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
TEXT_FILES = {"fp32": "model.text.onnx", "int8": "model.int8.text.onnx"}
app = cli_app()


@app.command(help=__doc__)
def main(
    dirs: list[Path] = typer.Argument(..., help="Export directories."),
    split_dir: Path = typer.Option(paths.TOKENIZED),
    sentences: int = typer.Option(500, help="The first N test sources."),
    threads: str = typer.Option("1"),
    precisions: str = typer.Option("int8,fp32"),
    beams: str = typer.Option("1,4"),
    batches: str = typer.Option("1,32"),
    repeats: int = typer.Option(3),
    scores: bool = typer.Option(False, "--scores", help="Also time each file returning scores."),
    whole_first: bool = typer.Option(False, "--whole-first", help="The first uncut."),
    text: bool = typer.Option(False, "--text", help="The text twins."),
) -> None:
    lines = list(test_split(split_dir)["source"])[:sentences]
    modes = (False, True) if scores else (False,)
    names = [f"{d}{'(whole)' if i == 0 and whole_first else ''}{'+scores' if scored else ''}"
             for i, d in enumerate(dirs) for scored in modes]
    for count in ints(threads):
        for precision in precisions.split(","):
            translators = [generation.load_translator(
                d / (TEXT_FILES if text else FILES)[precision], threads=count) for d in dirs]
            if whole_first:
                translators[0].open_batch = None
            for beam in [None] if text else ints(beams):  # None: the file's own beam
                for size in ints(batches):
                    runs = [passes(t, beam, size, scored) for t in translators for scored in modes]
                    print(f"{precision} threads {count} beam {beam or 'as written'} batch {size}:"
                          f" {paired(runs, names, lines, size, repeats)}", flush=True)


def passes(translator, beam: int, size: int, scored: bool):
    """One pass over `lines` -> the translations (with scores asked for: the best one's)."""
    if scored:
        return lambda lines: [hyps[0].text if hyps else "" for hyps in
                              translator.translate_scored(lines, beam, batch_size=size)]
    return lambda lines: translator.translate(lines, beam, batch_size=size)


def paired(runs: list, names: list[str], lines: list[str], size: int, repeats: int) -> str:
    """Each run warmed up on one batch, then `repeats` rounds of all in turn, the order reversed
    every other round: each one's sent/s, its speed against the first (the median of the rounds'
    ratios) and its share of translations identical to the first's."""
    for run in runs:
        run(lines[:size])
    seconds: list[list[float]] = [[] for _ in runs]
    outputs: list[list[str]] = [[] for _ in runs]
    for round_no in range(repeats):
        for i in range(len(runs)) if round_no % 2 == 0 else reversed(range(len(runs))):
            outputs[i], taken = timed(runs[i], lines)
            seconds[i].append(taken)
    speeds = "  ".join(f"{name}: {len(lines) / min(s):.1f}" for name, s in zip(names, seconds))
    paired = [statistics.median(a / b for a, b in zip(seconds[0], s)) for s in seconds[1:]]
    same = [same_share(o, outputs[0]) for o in outputs[1:]]
    return (f"{speeds} sent/s; speed against the first (median of {repeats} rounds): "
            f"{', '.join(f'{x:.3f}' for x in paired)}; identical to the first: "
            f"{', '.join(f'{x:.1%}' for x in same)}")


if __name__ == "__main__":
    run_cli(app)
