"""Run the experiment rows (bench/experiment_rows.json) as DVC experiments, each a `dvc exp run`
with its overrides, appending each row's scores to docs/experiments.jsonl (a row already there
is skipped) and putting back params.yaml's exact bytes after each: docs/experiments.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import typer

from bench.common import REPO, chosen, cli_app, markdown_table, read_jsonl, run_cli
from src.core.reports import LENGTH_BUCKETS

# name -> {"what": what it tests, "overrides": its `-S key=value`s}, each row's whole recipe.
# Short rows: 300 optimizer steps (steps, not minutes, so rows on a busy machine compare equal
# work), ranked by valid loss, test decoded greedily. Rows recorded before bidirectional
# training, concatenation and averaging 10 epochs became defaults set those back. en-vi's URLs
# are quoted: `dvc exp run -S` parses values with Hydra's grammar, where { is special.
ROWS: dict[str, dict] = json.loads((Path(__file__).parent / "experiment_rows.json").read_text(
    encoding="utf-8"))
TARGET = "evaluate"  # the stage each row runs the pipeline up to


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def run_row(name: str, results: Path, root: Path = REPO) -> dict:
    overrides = ROWS[name]["overrides"]
    cmd = ["dvc", "exp", "run", "-n", name,
           *[word for key, value in overrides.items() for word in ("-S", f"{key}={value}")],
           TARGET]
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    params = root / "params.yaml"
    before = params.read_bytes()
    try:
        subprocess.run(cmd, cwd=root, check=True)
    finally:
        params.write_bytes(before)
    return append_row(results, root, name, ROWS[name]["what"], {"overrides": overrides},
                      time.perf_counter() - start)


# what a row keeps of each named test set (evaluate's data/eval/stats.json, `test_sets`)
TEST_SET_KEYS = ("bleu", "chrf", "bleu_ge10w", "chrf_ge10w")


def append_row(results: Path, root: Path, name: str, what: str, recipe: dict,
               wall_seconds: float) -> dict:
    """A row from the files a run of the pipeline left in `root`, appended to `results`:
    evaluate's and train's stats, and each named test set's scores; `recipe` is {"overrides":
    the row's `-S` settings} or, for a recorded run, {"changes": its params.yaml changes}."""
    evaluated = read_json(root / "data/eval/stats.json")
    trained = read_json(root / "models/train_stats.json")
    row = {"name": name, "what": what, **recipe,
           **{k: evaluated.get(k) for k in ("bleu", "chrf", "beam_size")},
           **{k: trained.get(k) for k in ("train_seconds", "steps", "epochs", "tokens_per_s",
                                          "n_parameters", "final_valid_bleu", "final_valid_loss")},
           # BLEU by source length (evaluate's buckets: <= 6, 7-9, >= 10 words)
           **{f"bleu_{b}": evaluated.get(f"bleu_{b}") for b, _, _ in LENGTH_BUCKETS},
           "wall_seconds": round(wall_seconds, 1)}
    if evaluated.get("test_sets"):
        row["test_sets"] = {test_set: {k: scores.get(k) for k in TEST_SET_KEYS}
                            for test_set, scores in evaluated["test_sets"].items()}
    with results.open("a") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return row


def print_table(rows: list[dict]) -> None:
    print("\n".join(markdown_table(
        ["experiment", "what changes", "test BLEU", "chrF", "beam", "valid loss", "train min",
         "params"],
        [[r["name"], r["what"], r["bleu"], r["chrf"], r["beam_size"],
          r.get("final_valid_loss", "n/a"),
          f"{r['train_seconds'] / 60:.1f}" if r.get("train_seconds") else "n/a",
          f"{r['n_parameters'] / 1e6:.2f}M" if r.get("n_parameters") else "n/a"]
         for r in rows])))


app = cli_app()


@app.command(help=__doc__)
def main(
    rows: str = typer.Option("", help="Comma-separated row names (default: all)."),
    results: Path = typer.Option(REPO / "docs" / "experiments.jsonl", help="Rows appended here."),
    list_rows: bool = typer.Option(False, "--list", help="List the rows and exit."),
    record: Path = typer.Option(None, help="Record one row from a workspace where the pipeline "
                                "already ran (a recipe `-S` cannot give, such as a list of "
                                "corpora), named --name, described by --what and --change "
                                "KEY=VALUE, its wall time --wall-minutes; nothing is run."),
    name: str = typer.Option("", help="With --record: the row's name."),
    what: str = typer.Option("", help="With --record: what the row tests."),
    change: list[str] = typer.Option([], metavar="KEY=VALUE", help="With --record: each "
                                     "params.yaml change from the default, as text."),
    wall_minutes: float = typer.Option(0.0, help="With --record: the run's wall minutes."),
    table: bool = typer.Option(False, "--table", help="Print the table and exit."),
) -> None:
    if list_rows:
        for name, row in ROWS.items():
            print(f"{name:<22} {row['what']}  [{TARGET}] "
                  + " ".join(f"{k}={v}" for k, v in row["overrides"].items()))
        return
    if table:
        print_table(read_jsonl(results))
        return
    if record:
        if not (name and what) or any(r["name"] == name for r in read_jsonl(results)):
            sys.exit(f"error: --record needs a new --name (not one in {results}) and --what")
        if not (record / "data/eval/stats.json").exists():
            sys.exit(f"error: {record} holds no data/eval/stats.json: run the pipeline there")
        # "changes", not "overrides": no `dvc exp run -S` of ROWS re-runs such a row
        row = append_row(results, record, name, what,
                         {"changes": dict(item.split("=", 1) for item in change)},
                         60 * wall_minutes)
        print(f"{name}: BLEU {row['bleu']} chrF {row['chrf']}, recorded in {results}")
        return
    names = chosen(rows, ROWS, "--rows", "row") or list(ROWS)
    done = {r["name"] for r in read_jsonl(results)}
    for name in names:
        if name in done:
            print(f"{name}: already in {results}, skipped")
            continue
        try:
            row = run_row(name, results)
        except subprocess.CalledProcessError as exc:
            sys.exit(f"error: row {name} failed (exit {exc.returncode}); see the output above")
        print(f"{name}: BLEU {row['bleu']} chrF {row['chrf']} ({row['wall_seconds']} s)",
              flush=True)
    print_table(read_jsonl(results))


if __name__ == "__main__":
    run_cli(app)
