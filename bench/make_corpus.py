"""A large synthetic parallel corpus recombined from a real one (1-3 pairs joined, seeded), to
measure how the stages scale (bench.data_scaling), not to train on: docs/scaling.md.
"""

from __future__ import annotations

import random
from pathlib import Path

import typer

from bench import common

app = common.cli_app()


def read_pairs(path: Path) -> list[tuple[str, str]]:
    pairs = []
    with path.open(encoding="utf-8-sig") as fh:
        for line in fh:
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 2 and cols[0].strip() and cols[1].strip():
                pairs.append((cols[0].strip(), cols[1].strip()))
    return pairs


def recombined(pairs: list[tuple[str, str]], n: int, seed: int, joiner: str = " "):
    """`n` pairs, each 1-3 source pairs joined (target joined with `joiner`)."""
    rng = random.Random(seed)
    for _ in range(n):
        parts = [pairs[rng.randrange(len(pairs))] for _ in range(rng.choice((1, 1, 2, 3)))]
        yield " ".join(s for s, _ in parts), joiner.join(t for _, t in parts)


@app.command()
def main(
    source: Path = typer.Option(..., help="A TSV corpus (source<TAB>target[<TAB>…])."),
    pairs: int = typer.Option(..., min=1, help="How many pairs to write."),
    out: Path = typer.Option(..., help="TSV file to write."),
    seed: int = typer.Option(0, help="Random seed."),
    target_joiner: str = typer.Option("", help="Joins target sentences ('' for Chinese)."),
) -> None:
    """Write PAIRS recombined sentence pairs drawn from SOURCE to OUT."""
    base = read_pairs(source)
    if not base:
        raise typer.BadParameter(f"{source} holds no tab-separated pair", param_hint="--source")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for src, tgt in recombined(base, pairs, seed, target_joiner):
            fh.write(f"{src}\t{tgt}\n")
    print(f"wrote {pairs:,} pairs to {out}")


if __name__ == "__main__":
    common.run_cli(app)
