"""Run the README's experiment table as DVC experiments and print it as Markdown.

Each row is one `dvc exp run -n <name> -S key=value ...` on top of the workspace params.yaml, so
every row is also an MLflow run and appears in `dvc exp show`. `dvc exp run -S` writes its
overrides into params.yaml and leaves them there; this tool puts back the exact bytes the
file had before each row (also when a row fails or is interrupted), so neither a row's overrides
nor a user's uncommitted edits are lost. After a row finishes, its scores and run summary (the
stats files) are appended to a JSON-lines results file; a row already there is skipped, so a
killed sweep resumes.

    python -m bench.experiments --list
    python -m bench.experiments --rows short-base,short-ls0 --set download.url=../cmn-eng.zip
    python -m bench.experiments --table      # print the table from the results file

Short rows use a fixed number of steps, so they compare what each choice buys early in training,
not converged quality; full rows train the whole recipe. Decoding choices on a trained model
(beam, length penalty, checkpoint): bench.decoding_choices.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import typer

from bench.common import REPO, markdown_table
from src.core.cli import run_cli
from src.core.reports import LENGTH_BUCKETS

# Shared by every training row: a short, fixed number of optimizer steps (about two epochs of
# cmn-eng) and a warmup that fits inside it. Steps rather than minutes, so rows run side by
# side or on a busy machine still compare equal work. Epochs are ranked by valid loss and the
# test split is decoded greedily: the cheapest fair comparison.
# Every training row before full-e64-avg10 averaged the 5 best epochs (the default until then).
AVERAGE5 = {"train.average_best": "5"}
# Rows run before bidirectional training and concatenation became the default keep both off, so
# each re-runs what its recorded numbers came from (a row that sets either puts its value after).
EARLIER = {"train.bidirectional_epochs": "0", "train.concat_ratio": "0.0", **AVERAGE5}
SHORT = {"train.max_steps": "300", "train.warmup_steps": "150", "train.patience": "0",
         "train.select_by": "loss", "evaluate.beam_size": "1", **EARLIER}

# name -> (what it tests, overrides, stage target or None for the whole pipeline up to evaluate)
ROWS: dict[str, tuple[str, dict[str, str], str]] = {
    "short-base": ("short run: the default recipe", SHORT, "evaluate"),
    "short-ls0": ("short run: label smoothing 0", {**SHORT, "train.label_smoothing": "0"},
                  "evaluate"),
    "short-separate-vocab": ("short run: separate source/target vocabularies",
                             {**SHORT, "tokenize.shared_vocab": "false"}, "evaluate"),
    "short-vocab4k": ("short run: shared vocabulary of 4,000",
                      {**SHORT, "tokenize.vocab_size": "4000"}, "evaluate"),
    "short-post-ln": ("short run: post-LN", {**SHORT, "model.pre_norm": "false"}, "evaluate"),
    "short-d512": ("short run: d_model 512, 8 heads, FFN 2048",
                   {**SHORT, "model.d_model": "512", "model.n_heads": "8",
                    "model.ffn_dim": "2048"}, "evaluate"),
    "zh-en": ("900-step run: Chinese → English on the same corpus (BLEU 13a)",
              {**SHORT, "train.max_steps": "900", "train.warmup_steps": "300",
               "pair.source_lang": "zh", "pair.target_lang": "en",
               "pair.source_column": "1", "pair.target_column": "0"}, "evaluate"),
    # Full runs of the whole pipeline (the recipe's ablation): hours each on 2 cores.
    "full-default": ("the 60-epoch recipe before full-e64-avg10: d256, 3+3 layers, dropout "
                     "0.2, patience 10, concatenation 0.2; 60 epochs, the first 7 "
                     "bidirectional (each epoch 1.4 times the tokens)",
                     {"train.epochs": "60", **AVERAGE5}, "evaluate"),
    "full-epochs34": ("the previous default: the same recipe, 34 epochs",
                      {"train.epochs": "34", **AVERAGE5}, "evaluate"),
    "full-epochs34-cpu-dropout": ("full-epochs34 re-run with the CPU dropout of src/dropout.py "
                                  "(same recipe and mask distribution, other random draws): "
                                  "does the 18% faster training cost quality?",
                                  {"train.epochs": "34", **AVERAGE5}, "evaluate"),
    "full-default-cpu-dropout": ("full-default re-run with the CPU dropout of src/dropout.py "
                                 "(same recipe and mask distribution, other random draws)",
                                 {"train.epochs": "60", **AVERAGE5}, "evaluate"),
    "full-e64-avg10": ("the default with 64 epochs instead of 60 and model.pt averaging the 10 "
                       "best epochs instead of 5",
                       {"train.epochs": "64", "train.average_best": "10"}, "evaluate"),
    "full-epochs31": ("an earlier default: the same recipe, 31 epochs",
                      {"train.epochs": "31", **AVERAGE5}, "evaluate"),
    "full-no-concat": ("an earlier recipe, without concatenation: 44 epochs, the first 9 "
                       "bidirectional (about the same steps and time)",
                       {"train.concat_ratio": "0.0", "train.epochs": "44",
                        "train.bidirectional_epochs": "9", **AVERAGE5}, "evaluate"),
    "full-subword": ("the 60-epoch default with subword sampling, alpha 0.1 (training side "
                     "only, resampled each epoch); sampled segmentations are ~16% longer, so "
                     "51 epochs (the first 7 bidirectional) match its steps",
                     {"train.subword_alpha": "0.1", "train.epochs": "51", **AVERAGE5},
                     "evaluate"),
    "full-word-dropout": ("the 34-epoch default with target word dropout 0.1 (decoder-input "
                          "subwords replaced by <unk>; no extra compute)",
                          {"train.target_word_dropout": "0.1", "train.epochs": "34", **AVERAGE5},
                          "evaluate"),
    "full-heads2": ("the 34-epoch default with 2 attention heads instead of 4 (head size 128; "
                    "same parameters)", {"model.n_heads": "2", "train.epochs": "34", **AVERAGE5},
                    "evaluate"),
    "full-heads2-e60": ("the 60-epoch default with 2 attention heads instead of 4 (head size "
                        "128; same parameters)",
                        {"model.n_heads": "2", "train.epochs": "60", **AVERAGE5}, "evaluate"),
    "full-concat04-e45": ("the 60-epoch default with twice the concatenation (0.4: each epoch "
                          "1.8 times the tokens) over 45 epochs, the first 7 bidirectional, so "
                          "the run trains as many tokens",
                          {"train.concat_ratio": "0.4", "train.epochs": "45", **AVERAGE5},
                          "evaluate"),
    "full-enc5-dec3": ("the 34-epoch default with a deeper encoder: 5 encoder and 3 decoder "
                       "layers (9.2M parameters), training capped at 128 minutes",
                       {"model.n_layers": "5", "model.decoder_layers": "3",
                        "train.max_minutes": "128", "train.epochs": "34", **AVERAGE5}, "evaluate"),
    "full-default-55": ("an earlier recipe: 55 epochs in one direction, patience 10",
                        {"train.epochs": "55", **EARLIER}, "evaluate"),
    "full-old-default": ("the first recipe: 35 epochs in one direction, patience 6",
                         {"train.epochs": "35", "train.patience": "6", **EARLIER}, "evaluate"),
    "full-cand1": ("four levers at once: dropout 0.3, concatenation 0.5, subword sampling "
                   "alpha 0.2, target word dropout 0.1; 26 epochs (each twice the tokens)",
                   {**EARLIER, "model.dropout": "0.3", "train.concat_ratio": "0.5",
                    "train.subword_alpha": "0.2", "train.target_word_dropout": "0.1",
                    "train.epochs": "26"}, "evaluate"),
    "full-cand2": ("dropout 0.3 and the whole time budget: 55 epochs, patience 10",
                   {"model.dropout": "0.3", "train.epochs": "55", "train.patience": "10",
                    **EARLIER}, "evaluate"),
    "full-cosine-concat": ("cosine schedule to zero over 38 epochs and concatenation 0.2 "
                           "(each epoch 1.4 times the tokens, so 38 epochs take about the "
                           "55-epoch recipe's time)",
                           {**EARLIER, "train.schedule": "cosine",
                            "train.concat_ratio": "0.2", "train.epochs": "38"}, "evaluate"),
    "full-deep4-cosine-concat": ("4+4 layers (9.4M parameters), cosine schedule to zero over 29 "
                                 "epochs and concatenation 0.2 (29 epochs of the deeper model "
                                 "take about the 3+3 model's 38)",
                                 {**EARLIER, "model.n_layers": "4", "train.schedule": "cosine",
                                  "train.concat_ratio": "0.2", "train.epochs": "29"},
                                 "evaluate"),
    "full-zh-en": ("the 55-epoch recipe, Chinese → English on the same corpus (BLEU 13a)",
                   {"pair.source_lang": "zh", "pair.target_lang": "en",
                    "pair.source_column": "1", "pair.target_column": "0",
                    "train.epochs": "55", **EARLIER}, "evaluate"),
    "en-vi": ("short run: English → Vietnamese, train on IWSLT tst2012, test on tst2013",
              {**SHORT, "pair.target_lang": "vi",
               # IWSLT'15 tst2012/tst2013 (.en and .vi), which the repository does not ship:
               # put them in data/iwslt15/. Quoted: `dvc exp run -S` parses values with
               # Hydra's grammar, where { is special.
               "download.url": "'data/iwslt15/tst2012.{lang}'",
               "download.test_url": "'data/iwslt15/tst2013.{lang}'",
               "split.valid_size": "100", "tokenize.vocab_size": "2000"}, "evaluate"),
}


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def run_row(name: str, extra: dict[str, str], results: Path, root: Path = REPO) -> dict:
    what, overrides, target = ROWS[name]
    settings = {**extra, **overrides}  # a row's own overrides win (en-vi has its own data)
    cmd = ["dvc", "exp", "run", "-n", name]
    for key, value in settings.items():
        cmd += ["-S", f"{key}={value}"]
    cmd.append(target)
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    params = root / "params.yaml"
    before = params.read_bytes()
    try:
        subprocess.run(cmd, cwd=root, check=True)
    finally:
        params.write_bytes(before)
    evaluated = read_json(root / "data/eval/stats.json")
    trained = read_json(root / "models/train_stats.json")
    row = {
        "name": name,
        "what": what,
        "overrides": overrides,
        "bleu": evaluated.get("bleu"),
        "chrf": evaluated.get("chrf"),
        "beam_size": evaluated.get("beam_size"),
        "train_seconds": trained.get("train_seconds"),
        "epochs": trained.get("epochs"),
        "tokens_per_s": trained.get("tokens_per_s"),
        "n_parameters": trained.get("n_parameters"),
        "final_valid_bleu": trained.get("final_valid_bleu"),
        "final_valid_loss": trained.get("final_valid_loss"),
        # BLEU by source length (evaluate's buckets: <= 6, 7-9, >= 10 words)
        **{f"bleu_{name}": evaluated.get(f"bleu_{name}") for name, _, _ in LENGTH_BUCKETS},
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    with results.open("a") as fh:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return row


def load_results(results: Path) -> list[dict]:
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


def print_table(rows: list[dict]) -> None:
    print("\n".join(markdown_table(
        ["experiment", "what changes", "test BLEU", "chrF", "beam", "valid loss", "train min",
         "params"],
        [[r["name"], r["what"], r["bleu"], r["chrf"], r["beam_size"],
          r.get("final_valid_loss", "n/a"),
          f"{r['train_seconds'] / 60:.1f}" if r.get("train_seconds") else "n/a",
          f"{r['n_parameters'] / 1e6:.2f}M" if r.get("n_parameters") else "n/a"]
         for r in rows])))


app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command(help=__doc__)
def main(
    rows: str = typer.Option("", help="Comma-separated row names (default: all)."),
    set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="Extra override for "
                                   "every row, e.g. download.url=<local zip>."),
    results: Path = typer.Option(REPO / "docs" / "experiments.jsonl", help="JSON-lines file "
                                 "rows are appended to (and skipped if present)."),
    list_rows: bool = typer.Option(False, "--list", help="List the rows and exit."),
    table: bool = typer.Option(False, "--table", help="Print the table and exit."),
) -> None:
    if list_rows:
        for name, (what, overrides, target) in ROWS.items():
            print(f"{name:<22} {what}  [{target}] " + " ".join(f"{k}={v}" for k, v in
                                                             overrides.items()))
        return
    if table:
        print_table(load_results(results))
        return
    names = [n for n in rows.split(",") if n] or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        sys.exit(f"error: unknown row(s) {', '.join(unknown)}; see --list")
    extra = dict(item.split("=", 1) for item in set_)
    done = {r["name"] for r in load_results(results)}
    for name in names:
        if name in done:
            print(f"{name}: already in {results}, skipped")
            continue
        try:
            row = run_row(name, extra, results)
        except subprocess.CalledProcessError as exc:
            sys.exit(f"error: row {name} failed (exit {exc.returncode}); see the output above")
        print(f"{name}: BLEU {row['bleu']} chrF {row['chrf']} ({row['wall_seconds']} s)",
              flush=True)
    print_table(load_results(results))


if __name__ == "__main__":
    run_cli(app)
