"""score: how likely the model finds given translations (models/model.score.onnx; no torch).

    python -m src.score pairs.tsv                      # source<TAB>target per line
    python -m src.score pairs.tsv --format jsonl --output scores.jsonl

The log-probability of each target given its source, by teacher forcing through the scoring
file export writes (src/graph/likelihood_graph.py), as CTranslate2's `score_batch` and fairseq's
`--score-reference` give it: per sentence (sum over the target's tokens, EOS included, and the
mean per token) and, in JSON Lines, per token with its piece. Corpus cleaning sorts pairs by it:
the least likely are often misaligned or noisy. TSV out: line, log-probability, mean per token,
tokens. Pairs are scored in batches of similar length; the order is kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from src.core.atomic import write_text
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.core.text import read_lines
from src.runtime.likelihood import PairScore, load_scorer
from src.runtime.sessions import DEFAULT_THREADS

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
FORMATS = ("tsv", "jsonl")


def read_pairs(path: Path, source_column: int, target_column: int) -> list[tuple[str, str]]:
    """(source, target) of every line; a line without both is refused, naming it."""
    pairs = []
    need = max(source_column, target_column) + 1
    for line_no, line in enumerate(read_lines(path), start=1):
        cols = line.split("\t")
        if len(cols) < need:
            raise PipelineError(f"{path} line {line_no}: {len(cols)} column(s), expected "
                                f"source<TAB>target (columns {source_column} and "
                                f"{target_column})")
        source, target = cols[source_column].strip(), cols[target_column].strip()
        for side, text in (("source", source), ("target", target)):
            if not text:
                raise PipelineError(f"{path} line {line_no}: empty {side}")
        pairs.append((source, target))
    if not pairs:
        raise PipelineError(f"{path} holds no pairs")
    return pairs


def formatted(fmt: str, line_no: int, pair: tuple[str, str], scored: PairScore) -> str:
    if fmt == "tsv":
        return f"{line_no}\t{scored.logprob:.6f}\t{scored.mean_logprob:.6f}\t{scored.tokens}"
    return json.dumps({"line": line_no, "source": pair[0], "target": pair[1],
                       "logprob": round(scored.logprob, 6),
                       "mean_logprob": round(scored.mean_logprob, 6), "tokens": scored.tokens,
                       "token_logprobs": [round(v, 6) for v in scored.token_logprobs],
                       "pieces": list(scored.pieces)}, ensure_ascii=False)


@app.command()
def main(
    pairs_file: Path = typer.Argument(..., help="TSV of source<TAB>target pairs to score."),
    onnx: Path = typer.Option(Path("models/model.score.onnx"),
                              help="The scoring file written by src.export."),
    tokenizer: Path = typer.Option(None, help="Tokenizer dir (default: tokenizer/ beside it)."),
    output_file: Path = typer.Option(None, "--output", help="Write the scores here."),
    fmt: str = typer.Option("tsv", "--format",
                            help="tsv: line, log-probability, mean per token, tokens; jsonl: "
                                 "also the source, target and each token's log-probability."),
    batch_size: int = typer.Option(32, min=1, help="Pairs per session.run."),
    threads: int = typer.Option(DEFAULT_THREADS, min=1, help="CPU threads of ONNX Runtime."),
    source_column: int = typer.Option(0, min=0, help="Column of the source sentence."),
    target_column: int = typer.Option(1, min=0, help="Column of the given translation."),
) -> None:
    """Score given translations: the model's log-probability of each target for its source."""
    if fmt not in FORMATS:
        raise PipelineError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if source_column == target_column:
        raise PipelineError("--source-column and --target-column must differ")
    if not pairs_file.is_file():
        raise PipelineError(f"input file not found: {pairs_file}")
    pairs = read_pairs(pairs_file, source_column, target_column)
    scorer = load_scorer(onnx, tokenizer, threads)
    print(f"score: {scorer.ran_on}, {threads} thread{'s' * (threads > 1)}", file=sys.stderr)
    scored = scorer.score(pairs, batch_size)
    lines = [formatted(fmt, i, pair, s) + "\n"
             for i, (pair, s) in enumerate(zip(pairs, scored), start=1)]
    if output_file is not None:
        write_text(output_file, "".join(lines))
    else:
        sys.stdout.writelines(lines)


if __name__ == "__main__":
    run_cli(app)
