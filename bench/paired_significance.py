"""Is a candidate's translation of a split better than a baseline's? sacreBLEU's paired
bootstrap or approximate randomisation on two `src.evaluate` TSVs of the same split, BLEU and
chrF; the last line is the verdict: docs/experiments.md.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import typer

from bench import common
from src.core.metrics import bleu_tokenizer

COLUMNS = ("source", "reference", "hypothesis")
ALPHA = 0.05  # the significance level of the verdict (and of docs/results.md's decoding rows)


def read_translations(path: Path) -> dict[str, list[str]]:
    """The columns of an evaluate translations TSV, by name."""
    if not path.is_file():
        sys.exit(f"error: {path} not found (write it with `python -m src.evaluate "
                 f"--translations {path}`)")
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            sys.exit(f"error: {path} has no {', '.join(missing)} column: not a translations "
                     "TSV from `python -m src.evaluate`")
        rows = list(reader)
    return {c: [row[c] or "" for row in rows] for c in COLUMNS}


def check_same_split(baseline: dict[str, list[str]], candidate: dict[str, list[str]]) -> None:
    """A paired test compares sentence by sentence: both files must hold the same pairs."""
    if len(baseline["source"]) != len(candidate["source"]):
        sys.exit(f"error: the files translate different splits ({len(baseline['source']):,} vs "
                 f"{len(candidate['source']):,} rows)")
    for column in ("source", "reference"):
        for row, (a, b) in enumerate(zip(baseline[column], candidate[column]), start=1):
            if a != b:
                sys.exit(f"error: row {row:,} has a different {column} in the two files "
                         f"({a!r} vs {b!r}): not the same split, or not in the same order")


def paired_test(baseline: list[str], candidate: list[str], references: list[str],
                target_lang: str, test: str = "bs") -> dict[str, dict]:
    """Per metric (BLEU, chrF): both scores, the difference and its p-value."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    metrics = {"BLEU": BLEU(tokenize=bleu_tokenizer(target_lang)), "chrF": CHRF()}
    systems = [("baseline", baseline), ("candidate", candidate)]
    # sacreBLEU seeds its resampling (SACREBLEU_SEED, 12345 unless set): the p-value repeats.
    _, scores = PairedTest(systems, metrics, [references], test_type=test, n_samples=1000)()
    return {"BLEU" if name.startswith("BLEU") else "chrF": {
                "baseline": round(base.score, 2), "candidate": round(cand.score, 2),
                "difference": round(cand.score - base.score, 2), "p_value": cand.p_value}
            for name, (base, cand) in scores.items() if name != "System"}  # chrF is "chrF2"


def verdict(bleu: dict) -> str:
    # sacreBLEU counts only resampled differences strictly above the observed one, so two
    # identical systems would get p = 1/(samples+1): no difference is no difference.
    if bleu["difference"] == 0:
        return "no significant difference in BLEU: the two systems score the same"
    if bleu["p_value"] >= ALPHA:
        return (f"no significant difference in BLEU (p = {bleu['p_value']:.4f} >= {ALPHA}): "
                "the split cannot tell these systems apart")
    better = "candidate" if bleu["difference"] > 0 else "baseline"
    return f"{better} is better in BLEU (p = {bleu['p_value']:.4f} < {ALPHA})"


app = common.cli_app()


@app.command(help=__doc__)
def main(
    baseline: Path = typer.Argument(..., help="Translations TSV of the baseline."),
    candidate: Path = typer.Argument(..., help="Translations TSV of the candidate."),
    test: str = typer.Option("bs", help="bs (bootstrap) or ar (randomisation)."),
    target_lang: str = typer.Option(None, help="Target language, which picks BLEU's tokenizer "
                                    "(default: pair.target_lang of params.yaml)."),
) -> None:
    from src.core.errors import PipelineError
    from src.core.params import PairParams, load_params

    if test not in ("bs", "ar"):
        raise typer.BadParameter("expected bs or ar", param_hint="--test")
    try:
        target_lang = target_lang or load_params(PairParams).target_lang
    except PipelineError as exc:
        sys.exit(f"error: {exc} (or name the language with --target-lang)")
    base, cand = read_translations(baseline), read_translations(candidate)
    check_same_split(base, cand)
    result = paired_test(base["hypothesis"], cand["hypothesis"], base["reference"],
                         target_lang, test)
    print(f"{len(base['source']):,} sentences, target {target_lang}, "
          f"{'paired bootstrap' if test == 'bs' else 'approximate randomisation'}")
    for metric, r in result.items():
        print(f"{metric:<5} baseline {r['baseline']:6.2f}  candidate {r['candidate']:6.2f}  "
              f"difference {r['difference']:+.2f}  p = {r['p_value']:.4f}")
    print(verdict(result["BLEU"]))


if __name__ == "__main__":
    common.run_cli(app)
