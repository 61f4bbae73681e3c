"""Write docs/results.md from the raw measurements beside it, so every number has one source.

Reads docs/experiments.jsonl (rows appended by scripts/experiments.py), docs/benchmarks/*.json
(the default run, decoding choices, training speed by precision and beside the peer,
translation speed; benchmark_infer.py --json
writes the speed file) and docs/benchmarks/{sample,long}_translations.tsv. Each table names the
command that produced its numbers.

    python scripts/results.py            # rewrite docs/results.md
    python scripts/results.py --check    # exit 1 if docs/results.md is out of date (CI runs it)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
OUT = DOCS / "results.md"

# Rows of docs/experiments.jsonl by what they vary; anything else lands in "other rows".
DECODING_ROWS = ("greedy", "beam4-lp1.0", "beam5-lp1.0", "beam5-lp1.2")
# Other directions and pairs, kept out of the en→zh ablation: a full run first, then smoke runs.
PAIR_ROWS = ("full-zh-en", "zh-en", "en-vi")


def load_json(bench: Path, name: str) -> dict:
    return json.loads((bench / name).read_text(encoding="utf-8"))


def load_rows(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return out + [""]


def overrides(row: dict) -> str:
    return " ".join(f"`-S {k}={v}`" for k, v in row["overrides"].items())


def millions(n: int | None) -> str:
    return f"{n / 1e6:.2f}M" if n else "n/a"


def default_run(runs: list[dict], decoding: dict, experiments: dict[str, dict]) -> list[str]:
    """The default recipe, one column per published run (newest first): the same recipe on
    different machines and precisions gives different numbers, and each column says whose."""
    def column(run: dict) -> list:
        t, test = run["train"], run["test"]
        # a run stopped and resumed has step time but no single wall-clock figure
        wall = (f"{run['wall_minutes']} min" if run["wall_minutes"] is not None
                else run["wall_note"])
        return [f"{run.get('precision', 'fp32')}, {run.get('cpu', run['machine'])}",
                f"`{run['commit']}`, {run['date']}", wall,
                f"{t['epochs']} epochs, {t['steps']:,} steps, {t['train_minutes']} min, "
                f"{t['tokens_per_s']:,} tokens/s", f"{t['n_parameters']:,}",
                f"train {run['split']['train']:,} / valid {run['split']['valid']:,} / test "
                f"{run['split']['test']:,}", f"**{test['bleu']}**", test["chrf"],
                test["brevity_penalty"], test["hypotheses_with_unk"],
                test["hypotheses_with_replacement_char"],
                *[b["bleu"] for b in run["bleu_by_source_words"]]]

    first = runs[0]
    measures = ["precision, CPU", "commit, date", "wall time", "training", "parameters",
                "split (pairs)",
                f"test BLEU (sacreBLEU `{first['test']['bleu_tokenizer']}`, beam "
                f"{first['test']['beam_size']})", "test chrF", "brevity penalty",
                "hypotheses with `<unk>`",
                # byte-fallback pieces that do not form valid UTF-8 decode to U+FFFD
                "hypotheses with U+FFFD",
                *[f"BLEU, sources {b['bucket']} ({b['rows']:,} rows)"
                  for b in first["bleu_by_source_words"]]]
    columns = [column(run) for run in runs]
    lines = ["## The default recipe", ""]
    lines += [f"- `{run['command']}` ({run['machine']})" for run in runs]
    lines += ["", *table(["measure", *[f"run {i + 1}" for i in range(len(runs))]],
                         [[m, *(c[i] for c in columns)] for i, m in enumerate(measures)])]
    for i, run in enumerate(runs):
        ex = run["export"]
        lines += [f"Export of run {i + 1}'s model (`python -m src.export`): greedy parity "
                  f"{ex['greedy_parity']:.0%}, beam parity {ex['beam_parity']:.0%} on "
                  f"{ex['parity_sentences']} test sentences; `model.onnx` {ex['fp32_size_mb']} "
                  f"MB, BLEU {ex['fp32_bleu']}; `model.int8.onnx` {ex['int8_size_mb']} MB, BLEU "
                  f"{ex['int8_bleu']} (same output as fp32 on {ex['int8_same_as_fp32']:.1%} of "
                  "test sentences).", ""]
    lines += [
        "## Decoding and checkpoint choices",
        "",
    ]
    # The choices were measured on one trained model, which need not be today's default.
    base = experiments[decoding["model_row"]]
    lines += [f"On the model of the `{base['name']}` row ({base['what']}); test split unless "
              "said otherwise. The commands re-run today decode the current default's model.", ""]
    rows = [["beam 4, average of the 5 best epochs",
             f"`scripts/experiments.py --rows {base['name']}`", base["bleu"], base["chrf"]]]
    for name in DECODING_ROWS:
        if name in experiments:
            r = experiments[name]
            rows.append([r["what"], f"`scripts/experiments.py --rows {name}`: {overrides(r)}",
                         r["bleu"], r["chrf"]])
    single = decoding["best_single_checkpoint"]
    rows.append([f"best single checkpoint (epoch {single['epoch']})", f"`{single['command']}`",
                 single["bleu"], single["chrf"]])
    lines += table(["what", "command", "BLEU", "chrF"], rows)
    lp = decoding["length_penalty_on_valid"]
    lines += [f"Length penalty, tuned on the **valid** split (beam {lp['beam_size']}; "
              f"`{lp['command']}`, {lp['note']}):", ""]
    lines += table(["length penalty", "valid BLEU"],
                   [[r["length_penalty"], r["bleu"]] for r in lp["rows"]])
    return lines


def short_rows(rows: list[dict]) -> list[str]:
    lines = [
        "## Training choices (short runs)",
        "",
        "`python scripts/experiments.py --rows <name>`: 300 optimizer steps each (about 1.8 "
        "epochs), test decoded greedily. At 300 steps BLEU is below 1 for every row, so **the "
        "valid loss ranks them** (per-token NLL without smoothing; comparable only between rows "
        "with the same vocabulary). A smoke test of each switch, not evidence for the recipe.",
        "",
    ]
    lines += table(
        ["row", "what", "overrides", "test BLEU", "chrF", "valid loss", "params"],
        [[r["name"], r["what"], overrides(r), r["bleu"], r["chrf"], r.get("final_valid_loss"),
          millions(r.get("n_parameters"))] for r in rows],
    )
    return lines


def full_rows(rows: list[dict]) -> list[str]:
    """Full-length runs (`full-*` rows): the recipe's ablation, chosen on valid BLEU."""
    if not rows:
        return []
    lines = [
        "## Recipe ablation (full runs)",
        "",
        "`python scripts/experiments.py --rows <name>`: each row a whole `dvc exp run` of the "
        "pipeline with the overrides shown on top of the committed `params.yaml`. Choices are "
        "made on **valid BLEU** (greedy, the averaged final model); the test columns are "
        "beam 4, by source length in words.",
        "",
    ]
    lines += table(
        ["row", "what", "overrides", "valid BLEU", "test BLEU", "<= 6", "7-9", ">= 10", "chrF",
         "epochs", "train min", "commit"],
        [[r["name"], r["what"], overrides(r), r.get("final_valid_bleu"), r["bleu"],
          r.get("bleu_le6w"), r.get("bleu_7to9w"), r.get("bleu_ge10w"), r["chrf"],
          r.get("epochs"),
          round(r["train_seconds"] / 60, 1) if r.get("train_seconds") else None,
          r.get("commit")]
         for r in rows],
    )
    return lines + row_notes(rows)


def row_notes(rows: list[dict]) -> list[str]:
    """A bullet per row that has a note (how it was run, why it was or was not kept)."""
    # A note may already end a sentence; one full stop, not two.
    notes = [f"- {r['name']}: {r['note'].rstrip('.')}." for r in rows if r.get("note")]
    return notes + [""] if notes else []


def pair_rows(rows: list[dict]) -> list[str]:
    lines = ["## Other language pairs", "",
             "`full-*` rows are whole runs of a full-length recipe (the row says which) in "
             "another direction; the other rows are short runs that show a pair goes through "
             "every stage, not quality figures.", ""]
    lines += table(
        ["row", "what", "overrides", "test BLEU", "chrF", "length of training"],
        [[r["name"], r["what"], overrides(r), r["bleu"], r["chrf"],
          f"{r['overrides']['train.max_steps']} steps" if "train.max_steps" in r["overrides"]
          else f"{r.get('epochs')} epochs"] for r in rows],
    )
    return lines + row_notes(rows)


def training_speed(peer: dict) -> list[str]:
    p, o, q = peer["peer"], peer["ours"], peer["peer_quality"]

    def share_of_peak(tokens_per_s: int) -> float:
        # The peer's analytic FLOPs per token hold for ours too (same dims), so shares scale
        # with tokens/s.
        return p["mfu_analytic"] * tokens_per_s / p["tokens_per_s"]

    lines = ["## Training speed and the Hugging Face baseline", "", f"{peer['what']} "
             f"({peer['date']}).", ""]
    lines += table(
        ["system", "command", "tokens/s", "share of matmul peak"],
        [
            ["Hugging Face peer: " + p["script"], f"`{p['command']}`",
             f"{p['tokens_per_s']:,} (2 threads {p['tokens_per_s_2_threads']:,}, 1 thread "
             f"{p['tokens_per_s_1_thread']:,})",
             f"{p['mfu_analytic']:.0%} of {p['matmul_peak_gflops']} GFLOP/s"],
            ["ours: the train stage" + (f" at `{o['commit']}`" if "commit" in o else ""),
             f"`{o['command']}`", f"{o['tokens_per_s']:,}",
             f"~{share_of_peak(o['tokens_per_s']):.0%} (peer's analytic count)"],
            *[[f"{v['what']} at `{v['commit']}`", f"`{v['command']}`", f"{v['tokens_per_s']:,}",
               f"~{share_of_peak(v['tokens_per_s']):.0%}"] for v in peer.get("ours_variants", [])],
        ],
    )
    lines += [f"Peer quality: {q['bleu']} BLEU (beam 4; {q['bleu_greedy']} greedy) after "
              f"{q['train_minutes']} CPU minutes at {q['tokens_per_s']:,} tokens/s "
              f"(`{q['command']}`; {q['note']}).", ""]
    return lines


def training_speed_by_precision(sitting: dict) -> list[str]:
    """Peer and ours in fp32 and bf16 from one sitting; shares of each precision's own peak."""
    peak = sitting["matmul_peak_gflops"]

    def share(row: dict) -> str:
        # The peer's analytic FLOPs per token hold for ours too (same dims).
        gflops = sitting["gflop_per_token"] * row["tokens_per_s"]
        return f"{gflops / peak[row['precision']]:.0%} of {peak[row['precision']]} GFLOP/s"

    peer_fp32 = next(r for r in sitting["rows"] if r["system"].endswith("peer")
                     and r["precision"] == "fp32")["tokens_per_s"]
    lines = ["## Training speed by precision", "",
             f"{sitting['what']} CPU: {sitting['cpu']}; {sitting['date']}, code at "
             f"`{sitting['commit']}`. Matmul peaks: `{sitting['peak_command']}`.", ""]
    lines += table(
        ["system", "precision", "ranks x threads", "command", "tokens/s", "x peer fp32",
         "share of the precision's matmul peak"],
        [[r["system"], r["precision"], r["layout"], f"`{r['command']}`",
          f"{r['tokens_per_s']:,}", f"{r['tokens_per_s'] / peer_fp32:.2f}", share(r)]
         for r in sitting["rows"]],
    )
    return lines + [sitting["note"], ""]


def continuous_training(ct: dict) -> list[str]:
    """Issue 58's three runs, one column each: a parent on half the training sources, the
    parent fine-tuned on all of them, and the from-scratch run on all of them."""
    runs = ct["runs"]
    buckets = (("le6w", "<= 6"), ("7to9w", "7-9"), ("ge10w", ">= 10"))
    halves = ct["halves"]

    def half(run: dict, which: str) -> str:
        one = run["halves"][which]
        return f"{one['bleu']} / {one['chrf']}"

    rows = [["command", *[f"`{r['command']}`" for r in runs]],
            ["training pairs", *[f"{r['train_pairs']:,}" for r in runs]],
            ["starts from", *[r["starts_from"] for r in runs]],
            ["epochs, steps", *[f"{r['epochs']}, {r['steps']:,}" for r in runs]],
            ["training minutes (train stage's step time)",
             *[f"**{r['train_minutes']}**" for r in runs]],
            ["tokens/s", *[f"{r['tokens_per_s']:,}" for r in runs]],
            ["valid BLEU (greedy, selects epochs)", *[r["valid_bleu"] for r in runs]],
            ["test BLEU (beam 4)", *[f"**{r['test']['bleu']}**" for r in runs]],
            ["test chrF", *[r["test"]["chrf"] for r in runs]],
            *[[f"test BLEU, sources {label} words", *[r["test"][f"bleu_{key}"] for r in runs]]
              for key, label in buckets],
            [f"old half: BLEU / chrF ({halves['sentences']:,} training pairs the parent saw)",
             *[half(r, "old") for r in runs]],
            [f"new half: BLEU / chrF ({halves['sentences']:,} training pairs it did not)",
             *[half(r, "new") for r in runs]]]
    lines = ["## Starting from a trained model: parent, fine-tune, from scratch", "",
             f"{ct['what']} CPU: {ct['cpu']}; {ct['date']}, code at `{ct['commit']}`. The "
             f"fine-tune recipe was chosen by the rule in docs/experiments.md, written before "
             f"the runs. Old and new halves: `{halves['command']}`.", ""]
    lines += table(["measure", *[r["name"] for r in runs]], rows)
    return lines + [line for note in ct["notes"] for line in (note, "")]


def translation_speed(speed: dict) -> list[str]:
    base = {(r["beam"], r["batch"]): r["sent_s"] for r in speed["rows"]
            if r["system"] == "torch-nocache"}
    lines = ["## Translation speed", "", f"{speed['what']}. `{speed['command']}` at commit "
             f"`{speed['commit']}` ({speed['date']}).", ""]
    lines += table(
        ["system", "threads", "beam", "batch", "sent/s", "x PyTorch without cache"],
        [[r["system"], r["threads"], r["beam"], r["batch"], r["sent_s"],
          f"{r['sent_s'] / base[(r['beam'], r['batch'])]:.2f}"] for r in speed["rows"]],
    )
    return lines


def samples(bench: Path, title: str, judged: str, sentences: str) -> list[str]:
    """A table of sentences written for this page, the default model's output and a verdict."""
    with (bench / judged).open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    lines = [f"## {title}", "",
             f"Sentences written for this page (`docs/{sentences}`, not from the corpus), "
             "translated by the default run's model: `python -m src.infer --onnx "
             f"models/model.onnx --input docs/{sentences}` (beam 4).", ""]
    lines += table(["English", "model output", "verdict"],
                   [[r["english"], r["model_output"], r["verdict"]] for r in rows])
    return lines


def render(docs: Path = DOCS) -> str:
    bench = docs / "benchmarks"
    rows = load_rows(docs / "experiments.jsonl")
    by_name = {r["name"]: r for r in rows}
    short = [r for r in rows if r["name"].startswith("short-")]
    full = [r for r in rows if r["name"].startswith("full-") and r["name"] not in PAIR_ROWS]
    pairs = [by_name[n] for n in PAIR_ROWS if n in by_name]
    lines = [
        "# Results",
        "",
        "<!-- Generated by `python scripts/results.py` from docs/experiments.jsonl and "
        "docs/benchmarks/; edit those, not this file. -->",
        "",
        "Measured on a 2-core CPU machine without a GPU. Every table names the command behind "
        "its numbers; the raw rows are in `docs/experiments.jsonl` and `docs/benchmarks/`.",
        "",
        "Precision and CPU: every training run before 2026-11-26 (the default run, the ablation "
        "and pair rows) trained in fp32, as training had no other precision on a CPU then; their "
        "CPU was not recorded per row (the machines were Intel Xeons with AMX lately, AMD EPYCs "
        "before). Tables measured since name theirs.",
        "",
    ]
    runs = [load_json(bench, "default_run.json")] + [
        load_json(bench, p.name) for p in sorted(bench.glob("default_run_*.json"))]
    lines += default_run(runs, load_json(bench, "decoding.json"), by_name)
    lines += training_speed_by_precision(load_json(bench, "train_speed.json"))
    lines += training_speed(load_json(bench, "peer_train.json"))
    lines += translation_speed(load_json(bench, "infer_speed.json"))
    lines += continuous_training(load_json(bench, "continuous_training.json"))
    lines += full_rows(full)
    lines += short_rows(short)
    lines += pair_rows(pairs)
    lines += samples(bench, "Sample translations", "sample_translations.tsv",
                     "sample_sentences.en")
    lines += samples(bench, "Longer sentences", "long_translations.tsv", "long_sentences.en")
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="only compare; exit 1 if docs/results.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            sys.exit(f"error: {OUT} is out of date: run python scripts/results.py")
        return
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
