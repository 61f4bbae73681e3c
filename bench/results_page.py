"""Write docs/results.md from bench/results_template.md (the page's text, its numbers as fields)
and the raw rows, docs/experiments.jsonl and the docs/benchmarks/ files named in BENCHMARKS, so
every number has one source (`--check`: exit 1 if the page is out of date).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import typer

from bench import common
from bench.common import PEER, REPO, best_speed, latest_by_cpu, markdown_table, read_jsonl
from bench.paired_significance import ALPHA  # the significance level of the decoding rows

DOCS = REPO / "docs"
OUT = DOCS / "results.md"
TEMPLATE = Path(__file__).with_name("results_template.md")

# Every file of docs/benchmarks/ this page reads; the page cites each by its full name.
BENCHMARKS = {"default": "default_run.json", "decoding": "decoding.json",
              "train_speed": "train_speed_sittings.json", "peer": "peer_train.json",
              "infer": "infer_speed.json", "continuous": "continuous_training.json",
              "samples": "sample_translations.tsv", "long": "long_translations.tsv"}
# Other directions and pairs, kept out of the en→zh ablation: a full run first, then smoke runs.
PAIR_ROWS = ("full-zh-en", "zh-en", "en-vi")
# Pairs of rows that ran one recipe twice with other random draws: their gap is the spread
# between runs.
REPEATED_ROWS = (("full-epochs34", "full-epochs34-cpu-dropout"),
                 ("full-default", "full-default-cpu-dropout"))
# Rows scored on the named HSK test sets (everyday sentences): today's default first, then the
# recipes that add the dictionary, each held to the targets below against it.
HSK_BASE_ROW = "hsk-default"
HSK_TARGETS = {"hsk_test_bleu": 3.0, "hsk_test_chrf": 3.0, "test_bleu": -0.3,
               "minutes_ratio": 1.15}
# Columns of continuous_training.json: the parent, today's fine-tune recipe, from scratch.
PARENT_RUN, FINETUNE_RUN, SCRATCH_RUN = "(a)", "(b5)", "(c)"
# The finetune section the fine-tunes' commands override (params.yaml when they ran).
FINETUNE_BASE = {"finetune.lr": "0.0003", "finetune.warmup_steps": "200", "finetune.epochs": "24"}


def load_json(bench: Path, name: str) -> dict:
    return json.loads((bench / name).read_text(encoding="utf-8"))


def overrides(row: dict) -> str:
    return " ".join(f"`-S {k}={v}`" for k, v in row["overrides"].items())


def run_in_main_dvc_lock(runs: list[dict], source: str) -> int:
    """The index of the one default run marked `in_main_dvc_lock` (how its outputs came to be
    main's dvc.lock and committed metric files)."""
    in_lock = [i for i, run in enumerate(runs) if run.get("in_main_dvc_lock")]
    if len(in_lock) != 1:
        raise SystemExit(f"{source}: exactly one run must say how it is in main's dvc.lock "
                         f"(`in_main_dvc_lock`), not {len(in_lock)}")
    return in_lock[0]


def default_run(runs: list[dict]) -> list[str]:
    """One column per run; under the table, a line per run on how it ran."""
    def column(run: dict) -> list:
        t, test, ex = run["train"], run["test"], run["export"]
        # a run stopped and resumed has step time but no single wall-clock figure
        wall = (f"{run['wall_minutes']} min" if run["wall_minutes"] is not None
                else "none: trained in sittings, each resumed bit for bit by `dvc repro`")
        return [f"{run.get('precision', 'fp32')}, {run.get('cpu', run['machine'])}",
                f"`{run['commit']}`", wall,
                f"{t['epochs']} epochs, {t['steps']:,} steps, {t['train_minutes']} min, "
                f"{t['tokens_per_s']:,} tokens/s", f"{t['n_parameters']:,}",
                f"train {run['split']['train']:,} / valid {run['split']['valid']:,} / test "
                f"{run['split']['test']:,}", f"**{test['bleu']}**", test["chrf"],
                test["brevity_penalty"],
                f"{test['hypotheses_with_unk']} / {test['hypotheses_with_replacement_char']}",
                *[b["bleu"] for b in run["bleu_by_source_words"]],
                f"{ex['greedy_parity']:.0%} / {ex['beam_parity']:.0%} of "
                f"{ex['parity_sentences']}",
                f"{ex['fp32_size_mb']} MB, {ex['fp32_bleu']}",
                f"{ex['int8_size_mb']} MB, {ex['int8_bleu']}, {ex['int8_same_as_fp32']:.1%}"]

    first = runs[0]
    measures = ["precision, CPU", "code", "wall time", "training", "parameters",
                "split (pairs)",
                f"test BLEU (sacreBLEU `{first['test']['bleu_tokenizer']}`, beam "
                f"{first['test']['beam_size']})", "test chrF", "brevity penalty",
                # byte-fallback pieces that do not form valid UTF-8 decode to U+FFFD
                "hypotheses with `<unk>` / with U+FFFD",
                *[f"BLEU, sources {b['bucket']} ({b['rows']:,} rows)"
                  for b in first["bleu_by_source_words"]],
                "export: greedy / beam parity with PyTorch (test sentences)",
                "`model.onnx`: size, test BLEU",
                "`model.int8.onnx`: size, test BLEU, same output as fp32"]
    columns = [column(run) for run in runs]
    table = markdown_table(["measure", *[f"run {i + 1}" for i in range(len(runs))]],
                           [[m, *(c[i] for c in columns)] for i, m in enumerate(measures)])
    return table + [""] + [
        f"- Run {i + 1}: {run['machine']}; allocator: {run.get('allocator', 'glibc')}; "
        f"beside it: {run.get('beside', 'not recorded')}." for i, run in enumerate(runs)]


def decoding_choices(decoding: dict) -> list[str]:
    default = decoding["rows"][0]

    def against_default(row: dict) -> str:
        if row is default:
            return "(the default)"
        better = row["valid_bleu"] > default["valid_bleu"]
        if row["valid_p_bleu"] >= ALPHA:
            return f"no difference (p {row['valid_p_bleu']})"
        return f"{'better' if better else 'worse'} (p {row['valid_p_bleu']})"

    return markdown_table(
        ["what", "beam", "length penalty", "model file", "valid BLEU",
         "on valid, against the default", "test BLEU", "test chrF", "sent/s"],
        [[r["what"], r["beam"], r["length_penalty"], f"`{r['model']}`", r["valid_bleu"],
          against_default(r), r["test_bleu"], r["test_chrf"], r["test_sent_s"]]
         for r in decoding["rows"]])


def spread(by_name: dict[str, dict]) -> str:
    """The gap between two runs of one recipe, from the rows that repeated one."""
    pairs = [(by_name[a], by_name[b]) for a, b in REPEATED_ROWS]

    def widest(key: str) -> float:
        return max(abs(a[key] - b[key]) for a, b in pairs)

    names = ", ".join(f"`{a['name']}` and `{b['name']}`" for a, b in pairs)
    return (f"One recipe run twice with other random draws ({names}) moved valid BLEU by up "
            f"to {widest('final_valid_bleu'):.2f} and test BLEU by up to {widest('bleu'):.2f}: "
            "a gap between two rows smaller than that is not a result.")


def full_rows(rows: list[dict]) -> list[str]:
    return markdown_table(
        ["row", "what", "overrides", "valid BLEU", "test BLEU", "<= 6", "7-9", ">= 10", "chrF",
         "epochs", "train min", "commit"],
        [[r["name"], r["what"], overrides(r), r.get("final_valid_bleu"), r["bleu"],
          r.get("bleu_le6w"), r.get("bleu_7to9w"), r.get("bleu_ge10w"), r["chrf"],
          r.get("epochs"), round(r["train_seconds"] / 60, 1) if r.get("train_seconds") else None,
          r.get("commit")] for r in rows])


def against_hsk_targets(row: dict, base: dict) -> str:
    """What a row gained over today's default, each against its target, and the verdict."""
    hsk, hsk_base = row["test_sets"]["hsk_test"], base["test_sets"]["hsk_test"]
    gains = {"hsk_test_bleu": hsk["bleu"] - hsk_base["bleu"],
             "hsk_test_chrf": hsk["chrf"] - hsk_base["chrf"],
             "test_bleu": row["bleu"] - base["bleu"],
             "minutes_ratio": row["train_seconds"] / base["train_seconds"]}
    met = [gains[k] >= t if k != "minutes_ratio" else gains[k] <= t
           for k, t in HSK_TARGETS.items()]
    goal = HSK_TARGETS
    # Minutes of two sittings drift with the host (up to ~40%); the steps ratio does not.
    steps = (f", steps x{row['steps'] / base['steps']:.2f}"
             if row.get("steps") and base.get("steps") else "")
    return (f"hsk_test BLEU {gains['hsk_test_bleu']:+.2f} (target {goal['hsk_test_bleu']:+g}), "
            f"chrF {gains['hsk_test_chrf']:+.2f} ({goal['hsk_test_chrf']:+g}); test BLEU "
            f"{gains['test_bleu']:+.2f} (>= {goal['test_bleu']:g}); minutes "
            f"x{gains['minutes_ratio']:.2f} (<= {goal['minutes_ratio']:g}{steps}): "
            f"{'every target met' if all(met) else f'{met.count(False)} of {len(met)} missed'}")


def hsk_rows(rows: list[dict]) -> list[str]:
    """Today's default, then each recipe against it; under the table, the rows' notes."""
    base = {r["name"]: r for r in rows}[HSK_BASE_ROW]
    return markdown_table(
        ["row", "what", "valid BLEU", "test BLEU", "hsk_dev BLEU / chrF",
         "hsk_test BLEU / chrF", "hsk_test >= 10 words", "train min", "against today's default"],
        [[r["name"], r["what"], r.get("final_valid_bleu"), r["bleu"],
          *(f"{r['test_sets'][s]['bleu']} / {r['test_sets'][s]['chrf']}"
            for s in ("hsk_dev", "hsk_test")),
          r["test_sets"]["hsk_test"]["bleu_ge10w"], round(r["train_seconds"] / 60, 1),
          "(today's default)" if r is base else against_hsk_targets(r, base)]
         for r in rows]) + [""] + row_notes(rows)


def row_notes(rows: list[dict]) -> list[str]:
    """A bullet per row that has a note (how it was run, why it was or was not kept)."""
    # A note may already end a sentence; one full stop, not two.
    return [f"- {r['name']}: {r['note'].rstrip('.')}." for r in rows if r.get("note")]


def pair_rows(rows: list[dict]) -> list[str]:
    return markdown_table(
        ["row", "what", "overrides", "test BLEU", "chrF", "length of training"],
        [[r["name"], r["what"], overrides(r), r["bleu"], r["chrf"],
          f"{r['overrides']['train.max_steps']} steps" if "train.max_steps" in r["overrides"]
          else f"{r.get('epochs')} epochs"] for r in rows])


def short_cpu(cpu: str) -> str:
    """"Intel(R) Xeon(R) Processor (family 6 model 167), 2 cores, AMX" -> "Intel Xeon
    (family 6 model 167)": a sitting's heading."""
    name = cpu.split(", ")[0].replace("(R)", "").replace(" Processor", "")
    return " ".join(name.split())


def training_speed_by_precision(all_sittings: list[dict]) -> list[str]:
    """A line per CPU's last sitting on how it ran, then one table of their rows."""
    sittings = latest_by_cpu(all_sittings)
    lines = [f"- **{short_cpu(s['cpu'])}**, code at `{s['commit']}`, {s['date']}: "
             f"{s['what']} CPU: {s['cpu']}. Matmul peaks: `{s['peak_command']}`."
             for s in sittings]
    header = ["CPU", "system", "precision", "ranks x threads", "allocator", "tokens/s",
              "x peer fp32", "share of the precision's matmul peak"]
    return lines + [""] + markdown_table(header, [row for s in sittings for row in speed_rows(s)])


def speed_rows(sitting: dict) -> list[list]:
    """A sitting's rows, each against the sitting's best peer fp32 row."""
    peak = sitting["matmul_peak_gflops"]

    def share(row: dict) -> str:
        # The peer's analytic FLOPs per token hold for ours too (same dims).
        gflops = sitting["gflop_per_token"] * row["tokens_per_s"]
        return f"{gflops / peak[row['precision']]:.0%} of {peak[row['precision']]} GFLOP/s"

    peer_fp32 = best_speed(sitting["rows"], PEER, "fp32")
    return [[short_cpu(sitting["cpu"]), r["system"], r["precision"], r["layout"],
             r.get("allocator") or "glibc", f"{r['tokens_per_s']:,}",
             f"{r['tokens_per_s'] / peer_fp32:.2f}", share(r)]
            for r in sitting["rows"]]


def continuous_training(ct: dict) -> list[str]:
    def recipe(run: dict) -> str:
        """A fine-tune's lr / warmup / epochs: FINETUNE_BASE with its command's overrides."""
        if "init_from" not in run["command"]:
            return ""
        values = dict(FINETUNE_BASE)
        values.update(word.split("=", 1) for word in run["command"].split()
                      if word.startswith("finetune."))
        return " / ".join(values[k] for k in FINETUNE_BASE)

    return markdown_table(
        ["run", "command", "finetune lr / warmup / epochs", "pairs", "epochs, steps",
         "train min", "tokens/s", "valid BLEU", "test BLEU", "chrF", ">= 10 words",
         "old half BLEU / chrF", "new half BLEU / chrF"],
        [[r["name"], f"`{r['command']}`", recipe(r), f"{r['train_pairs']:,}",
          f"{r['epochs']}, {r['steps']:,}", r["train_minutes"], f"{r['tokens_per_s']:,.0f}",
          r["valid_bleu"], f"**{r['test']['bleu']}**", r["test"]["chrf"],
          r["test"]["bleu_ge10w"], *(f"{r['halves'][h]['bleu']} / {r['halves'][h]['chrf']}"
                                     for h in ("old", "new"))] for r in ct["runs"]])


def fine_tune_against_scratch(ct: dict) -> dict:
    """The figures of the paragraph under the table: today's recipe against the others."""
    by = {r["name"].split()[0]: r for r in ct["runs"]}
    tuned, scratch = by[FINETUNE_RUN], by[SCRATCH_RUN]
    speeds = [r["tokens_per_s"] for r in ct["runs"]]
    return {"finetune_run": FINETUNE_RUN, "parent": by[PARENT_RUN], "tuned": tuned,
            "scratch": scratch, "gain": tuned["test"]["bleu"] - scratch["test"]["bleu"],
            "minutes_share": tuned["train_minutes"] / scratch["train_minutes"],
            "steps_share": tuned["steps"] / scratch["steps"],
            "slowest": min(speeds), "fastest": max(speeds)}


def translation_speed(speed: dict) -> list[str]:
    """One row per system and thread count, one column per beam and batch: sent/s, and in
    brackets the ratio to PyTorch without cache at that beam and batch."""
    base = {(r["beam"], r["batch"]): r["sent_s"] for r in speed["rows"]
            if r["system"] == "torch-nocache"}
    cells = list(dict.fromkeys((r["beam"], r["batch"]) for r in speed["rows"]))
    systems = list(dict.fromkeys((r["system"], r["threads"]) for r in speed["rows"]))
    by = {(r["system"], r["threads"], r["beam"], r["batch"]): r for r in speed["rows"]}

    def cell(system: str, threads: int, beam: int, batch: int) -> str:
        r = by.get((system, threads, beam, batch))
        return f"{r['sent_s']} ({r['sent_s'] / base[(beam, batch)]:.2f})" if r else ""

    return markdown_table(
        ["system", "threads", *[f"beam {beam}, batch {batch}" for beam, batch in cells]],
        [[system, threads, *[cell(system, threads, *c) for c in cells]]
         for system, threads in systems])


def samples(path: Path) -> list[str]:
    """Sentences written for this page, the default model's output and a verdict."""
    with path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return markdown_table(["English", "model output", "verdict"],
                          [[r["english"], r["model_output"], r["verdict"]] for r in rows])


def render(docs: Path = DOCS) -> str:
    bench = docs / "benchmarks"
    data = {key: load_json(bench, name) for key, name in BENCHMARKS.items()
            if name.endswith(".json")}
    rows = read_jsonl(docs / "experiments.jsonl")
    by_name = {r["name"]: r for r in rows}
    runs = common.sittings_of(data["default"])
    lock = run_in_main_dvc_lock(runs, BENCHMARKS["default"])
    tables = {
        "default_run": default_run(runs),
        "decoding_choices": decoding_choices(data["decoding"]),
        "training_speed": training_speed_by_precision(common.sittings_of(data["train_speed"])),
        "translation_speed": translation_speed(data["infer"]),
        "continuous_training": continuous_training(data["continuous"]),
        "full_rows": full_rows([r for r in rows if r["name"].startswith("full-")
                                and r["name"] not in PAIR_ROWS]),
        "hsk_rows": hsk_rows([r for r in rows if r["name"].startswith("hsk-")]),
        "pair_rows": pair_rows([by_name[n] for n in PAIR_ROWS if n in by_name]),
        "samples": samples(bench / BENCHMARKS["samples"]),
        "long": samples(bench / BENCHMARKS["long"])}
    return TEMPLATE.read_text(encoding="utf-8").format_map(
        {key: "\n".join(lines) for key, lines in tables.items()}
        | data | fine_tune_against_scratch(data["continuous"])
        | {"cite": {key: f"`docs/benchmarks/{name}`" for key, name in BENCHMARKS.items()},
           "lock_run": lock + 1, "lock_note": runs[lock]["in_main_dvc_lock"], "alpha": ALPHA,
           "quality": data["peer"]["peer_quality"], "spread": spread(by_name),
           "finetune_base": ", ".join(f"`{k}: {v}`" for k, v in FINETUNE_BASE.items())})


app = common.cli_app()


@app.command(help=__doc__)
def main(check: bool = typer.Option(False, "--check", help="Only compare; exit 1 if "
                                    "docs/results.md is out of date.")) -> None:
    text = render()
    if check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            sys.exit(f"error: {OUT} is out of date: run python -m bench.results_page")
        return
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    common.run_cli(app)
