"""Fine-tune recipes side by side from one parent, each the train stage in a scratch copy of the
project, scored on the valid split only: docs/experiments.md,
docs/benchmarks/finetune_pilot_gpu.json.

    python -m bench.finetune_pilot --out pilot C2=7e-4,200 C4=7e-4,1000 C5=1e-3,1000,24
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from bench import common
from bench.common import REPO
from src.core.errors import PipelineError

SPEC = re.compile(r"(?P<name>[A-Za-z0-9_-]+)=(?P<lr>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?),"
                  r"(?P<warmup>\d+)(?:,(?P<epochs>\d+))?")


def parse_candidate(spec: str) -> dict:
    """NAME=LR,WARMUP[,EPOCHS] -> {"name", "lr", "warmup_steps"[, "epochs"]}."""
    match = SPEC.fullmatch(spec)
    if not match or float(match["lr"]) <= 0:
        raise typer.BadParameter(
            f"{spec!r} is not NAME=LR,WARMUP[,EPOCHS] (e.g. C5=1e-3,1000 or C5=1e-3,1000,24)")
    epochs = {"epochs": int(match["epochs"])} if match["epochs"] else {}
    return {"name": match["name"], "lr": float(match["lr"]),
            "warmup_steps": int(match["warmup"]), **epochs}


def prepare(project: Path, out: Path, candidate: dict, threads: int) -> Path:
    """The candidate's scratch copy of the project, its finetune values in params.yaml."""
    root = out / candidate["name"]
    (root / "models").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data/tokenized").symlink_to((project / "data/tokenized").resolve())
    (root / "models/parent").symlink_to((project / "models/parent").resolve())
    shutil.copytree(project / "models/tokenizer", root / "models/tokenizer")
    params = common.read_params(project / "params.yaml")
    params["finetune"].update({k: v for k, v in candidate.items() if k != "name"})
    if threads:
        params["train"]["threads"] = threads
    common.write_params(root / "params.yaml", params)
    return root


def start(root: Path) -> subprocess.Popen:
    """The train stage on the candidate's copy, its output in train.log (the child keeps the
    file open; ours closes here)."""
    print(f"finetune_pilot: {root.name} training ({root / 'train.log'})", file=sys.stderr,
          flush=True)
    with open(root / "train.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "src.train"], cwd=REPO,
                                env=common.project_env(root), stdout=log, stderr=subprocess.STDOUT)


def row(root: Path) -> dict:
    """The candidate's row, from the params.yaml and files its run left in its copy."""
    finetune = common.read_params(root / "params.yaml")["finetune"]
    stats = json.loads((root / "models/train_stats.json").read_text())
    with open(root / "models/valid_curve.csv") as f:
        curve = list(csv.DictReader(f))
    return {"candidate": root.name,
            **{f"finetune.{k}": finetune[k] for k in ("lr", "warmup_steps", "epochs")},
            **{k: stats[k] for k in ("steps", "epochs", "valid_bleu", "final_valid_loss",
                                     "train_minutes", "tokens_per_s", "precision", "threads")},
            "valid_bleu_by_epoch": [float(r["valid_bleu"]) for r in curve if r["valid_bleu"]],
            "valid_loss_by_epoch": [float(r["valid_loss"]) for r in curve]}


app = common.cli_app()


@app.command(help=__doc__)
def main(
    candidates: list[str] = typer.Argument(..., metavar="NAME=LR,WARMUP[,EPOCHS]..."),
    project: Path = typer.Option(Path("."), help="A project with train.init_from set, after "
                                 "`dvc repro tokenize`."),
    out: Path = typer.Option(..., help="A new folder for the candidates' copies and "
                             "pilot.json."),
) -> None:
    specs = [parse_candidate(spec) for spec in candidates]
    names = [c["name"] for c in specs]
    if len(set(names)) < len(names):
        raise typer.BadParameter(f"candidate names repeat: {' '.join(names)}")
    missing = [p for p in ("params.yaml", "data/tokenized", "models/tokenizer",
                           "models/parent/parent.json") if not (project / p).exists()]
    if missing:
        raise PipelineError(f"{project / missing[0]} not found: set train.init_from in "
                            f"{project / 'params.yaml'} and run `dvc repro tokenize` there first")
    if out.exists() and any(out.iterdir()):
        raise PipelineError(f"{out} is not empty: give a new folder")
    import torch

    on_gpu = torch.cuda.is_available()
    threads = max(1, (os.cpu_count() or 1) // len(specs)) if on_gpu else 0
    roots = [prepare(project, out, c, threads) for c in specs]
    if on_gpu:  # small models leave a GPU mostly idle: all at once
        procs = [start(root) for root in roots]
        failed = [root.name for root, proc in zip(roots, procs) if proc.wait()]
    else:
        failed = [root.name for root in roots if start(root).wait()]
    if failed:
        raise PipelineError(f"{', '.join(failed)} failed; see {out / failed[0] / 'train.log'}")
    rows = [row(root) for root in roots]
    report = {"command": common.command(), "device": "cuda" if on_gpu else "cpu", "rows": rows}
    common.write_json(out / "pilot.json", report, indent=1)
    for r in rows:
        print(f"{r['candidate']}: lr {r['finetune.lr']:g}, warmup {r['finetune.warmup_steps']}, "
              f"{r['steps']} steps: valid BLEU {r['valid_bleu']}, valid loss "
              f"{r['final_valid_loss']}")


if __name__ == "__main__":
    common.run_cli(app)
