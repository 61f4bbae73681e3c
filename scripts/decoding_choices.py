"""Decoding and checkpoint choices on a workspace's trained model: beam size, length penalty,
and the averaged model.pt against the best single checkpoint, each scored on the valid split
(where choices are made) and the test split, with a paired test against the default on valid.

    python scripts/decoding_choices.py --root <workspace> --json docs/benchmarks/decoding.json \\
        --model-note "run 5 of the default recipe"
    python scripts/decoding_choices.py --rows default,greedy      # some rows only

Each row is `python -m src.evaluate --split valid` and `--split test` with the row's
`evaluate.beam_size`, `evaluate.length_penalty` and `--model-path`, its outputs in a scratch
folder; the workspace's params.yaml gets its exact bytes back after each row, also when one
fails. The paired test is scripts/compare.py's (bootstrap, 1,000 resamples) of each row's valid
translations against the default row's. MLflow tracking is off for these evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere

from scripts.compare import paired_test, read_translations  # noqa: E402

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
    """One `src.evaluate` of the split into `out`; its stats (BLEU, chrF, sentences/s)."""
    files = {name: out / f"{split}.{name}" for name in
             ("metrics.json", "stats.json", "translations.tsv", "risk_coverage.csv")}
    cmd = [sys.executable, "-m", "src.evaluate", "--split", split,
           "--model-path", str(root / model), "--metrics", str(files["metrics.json"]),
           "--stats", str(files["stats.json"]), "--translations", str(files["translations.tsv"]),
           "--risk-coverage", str(files["risk_coverage.csv"])]
    env = {**os.environ, "NMT_ROOT": str(root), "NMT_TRACKING": "off"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return json.loads(files["stats.json"].read_text(encoding="utf-8"))


def run_row(root: Path, name: str, out: Path) -> dict:
    """Both splits of one row, with its search settings written into params.yaml for the
    time it runs."""
    what, beam, length_penalty, model = ROWS[name]
    params = root / "params.yaml"
    before = params.read_bytes()
    settings = yaml.safe_load(before)
    settings["evaluate"] |= {"beam_size": beam, "length_penalty": length_penalty}
    print(f"# {name}: {what}", flush=True)
    try:
        params.write_text(yaml.safe_dump(settings, sort_keys=False), encoding="utf-8")
        scores = {split: evaluate(root, split, model, out) for split in ("valid", "test")}
    finally:
        params.write_bytes(before)
    searched = {scores[split]["beam_size"] for split in scores}
    if searched != {beam}:  # the params file evaluate read was not the one written here
        sys.exit(f"decoding_choices: row {name} asked for beam {beam}, evaluate searched with "
                 f"{sorted(searched)}")
    return {"name": name, "what": what, "beam": beam, "length_penalty": length_penalty,
            "model": model, "valid_bleu": scores["valid"]["bleu"],
            "valid_chrf": scores["valid"]["chrf"], "test_bleu": scores["test"]["bleu"],
            "test_chrf": scores["test"]["chrf"],
            "test_sent_s": scores["test"]["sentences_per_s"]}


def main() -> None:
    from scripts.benchmark_training import cpu_description

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the workspace whose models/, data/tokenized and params.yaml are used")
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma list of {', '.join(ROWS)} ({BASELINE} is always run)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    p.add_argument("--model-note", default=None,
                   help="which model this is, for the JSON (default: the workspace's path)")
    a = p.parse_args()
    names = [BASELINE] + [n for n in a.rows.split(",") if n != BASELINE]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    missing = sorted({ROWS[n][3] for n in names if not (a.root / ROWS[n][3]).is_file()})
    if missing:
        p.error(f"{', '.join(missing)} not found under {a.root}: train first, or leave out "
                "the rows that need it")
    target_lang = yaml.safe_load((a.root / "params.yaml").read_bytes())["pair"]["target_lang"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = Path(tmp) / name
            out.mkdir()
            row = run_row(a.root, name, out)
            if name != BASELINE:
                translations = [read_translations(Path(tmp) / n / "valid.translations.tsv")
                                for n in (BASELINE, name)]
                bleu = paired_test(translations[0]["hypothesis"], translations[1]["hypothesis"],
                                   translations[0]["reference"], target_lang)["BLEU"]
                row["valid_p_bleu"] = round(bleu["p_value"], 4)
            rows.append(row)
            print(f"  {name:<16} valid BLEU {row['valid_bleu']:6.2f}  test BLEU "
                  f"{row['test_bleu']:6.2f}  p {row.get('valid_p_bleu', '-')}", flush=True)
    if a.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,  # the code
                                capture_output=True, text=True).stdout.strip() or "unknown"
        doc = {"what": "Decoding and checkpoint choices on one trained model",
               "command": shlex.join(["python", "scripts/decoding_choices.py", *sys.argv[1:]]),
               "model": a.model_note or str(a.root), "commit": commit,
               "machine": cpu_description(), "date": time.strftime("%Y-%m-%d"), "rows": rows}
        a.json.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n",
                          encoding="utf-8")
        print(f"# wrote {a.json}")


if __name__ == "__main__":
    main()
