"""Beam size, length penalty and checkpoint on a workspace's trained model, on the valid and
test splits, each paired-tested against the default on valid: docs/experiments.md,
docs/results.md, docs/benchmarks/decoding.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import typer
import yaml

from bench import common
from bench.common import REPO
from bench.paired_significance import paired_test, read_translations

AVERAGED, BEST = "models/model.pt", "models/checkpoints/best.pt"
# name -> (what it tests, beam, length penalty, model file); the first is the baseline.
ROWS = {
    "default": ("the default: beam 4, length penalty 1.0, model.pt (the average of the best "
                "epochs)", 4, 1.0, AVERAGED),
    "greedy": ("greedy", 1, 1.0, AVERAGED),
    "beam5": ("beam 5", 5, 1.0, AVERAGED),
    "beam8": ("beam 8", 8, 1.0, AVERAGED),
    "lp0.6": ("length penalty 0.6", 4, 0.6, AVERAGED),
    "lp1.3": ("length penalty 1.3", 4, 1.3, AVERAGED),
    "lp1.6": ("length penalty 1.6", 4, 1.6, AVERAGED),
    "best-checkpoint": ("the best single checkpoint (best.pt)", 4, 1.0, BEST),
}
BASELINE = next(iter(ROWS))


def evaluate(root: Path, split: str, model: str, out: Path) -> dict:
    """One `src.evaluate` of the split, its files in `out`; its stats (BLEU, chrF, sent/s)."""
    files = {"--metrics": "metrics.json", "--stats": "stats.json",
             "--translations": "translations.tsv", "--risk-coverage": "risk_coverage.csv"}
    cmd = [sys.executable, "-m", "src.evaluate", "--split", split,
           "--model-path", str(root / model)]
    for option, name in files.items():
        cmd += [option, str(out / f"{split}.{name}")]
    subprocess.run(cmd, cwd=REPO, env=common.project_env(root), check=True)
    return json.loads((out / f"{split}.stats.json").read_text(encoding="utf-8"))


def run_row(root: Path, name: str, out: Path) -> dict:
    """Both splits of one row, its search settings in params.yaml while it runs."""
    what, beam, length_penalty, model = ROWS[name]
    out.mkdir()
    params = root / "params.yaml"
    before = params.read_bytes()
    settings = yaml.safe_load(before)
    settings["evaluate"] |= {"beam_size": beam, "length_penalty": length_penalty}
    print(f"# {name}: {what}", flush=True)
    try:
        common.write_params(params, settings)
        scores = {split: evaluate(root, split, model, out) for split in ("valid", "test")}
    finally:
        params.write_bytes(before)
    searched = {scores[split]["beam_size"] for split in scores}
    if searched != {beam}:  # the params file evaluate read was not the one written here
        sys.exit(f"decoding_choices: row {name} asked for beam {beam}, evaluate searched with "
                 f"{sorted(searched)}")
    return {"name": name, "what": what, "beam": beam, "length_penalty": length_penalty,
            "model": model, **{f"{split}_{k}": scores[split][k] for split in ("valid", "test")
                               for k in ("bleu", "chrf")},
            "test_sent_s": scores["test"]["sentences_per_s"]}


app = common.cli_app()


@app.command(help=__doc__)
def main(
    root: Path = typer.Option(REPO, help="The workspace (models/, data/, params.yaml)."),
    rows: str = typer.Option(",".join(ROWS), help=f"Comma list of {', '.join(ROWS)} "
                             f"({BASELINE} is always run)."),
    json_out: Path = typer.Option(None, "--json", help="Write the rows here."),
    model_note: str = typer.Option(None, help="Which model this is, for the JSON."),
) -> None:
    names = [BASELINE] + [n for n in common.chosen(rows, ROWS, "--rows", "row") if n != BASELINE]
    missing = sorted({ROWS[n][3] for n in names if not (root / ROWS[n][3]).is_file()})
    if missing:
        raise typer.BadParameter(f"{', '.join(missing)} not found under {root}: train first, "
                                 "or leave out the rows that need it", param_hint="--rows")
    target_lang = common.read_params(root / "params.yaml")["pair"]["target_lang"]
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row = run_row(root, name, Path(tmp) / name)
            if name != BASELINE:
                base, cand = (read_translations(Path(tmp) / n / "valid.translations.tsv")
                              for n in (BASELINE, name))
                bleu = paired_test(base["hypothesis"], cand["hypothesis"], base["reference"],
                                   target_lang)["BLEU"]
                row["valid_p_bleu"] = round(bleu["p_value"], 4)
            found.append(row)
            print(f"  {name:<16} valid BLEU {row['valid_bleu']:6.2f}  test BLEU "
                  f"{row['test_bleu']:6.2f}  p {row.get('valid_p_bleu', '-')}", flush=True)
    if json_out:
        common.write_json(json_out, common.record(
            what="Decoding and checkpoint choices on one trained model",
            model=model_note or str(root), rows=found), indent=1)
        print(f"# wrote {json_out}")


if __name__ == "__main__":
    common.run_cli(app)
