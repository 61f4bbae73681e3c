"""The tools of bench/: the experiment driver never loses params edits, docs/results.md is what
bench.results_page renders from the raw rows, and the timing tools keep their protocols."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from bench import (
    common,
    engines_vs_ctranslate2,
    experiments,
    paired_significance,
    results_page,
    train_speed_vs_peer,
    train_step_speed,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("fails", [False, True])
def test_experiment_row_puts_back_the_users_params(tmp_path, monkeypatch, fails):
    params = tmp_path / "params.yaml"
    edited = b"train:\n  epochs: 7   # an uncommitted edit of the user\n"
    params.write_bytes(edited)
    commands = []

    def fake_run(cmd, cwd, check):
        commands.append(cmd)
        params.write_bytes(b"train:\n  epochs: 1\n")  # what `dvc exp run -S` leaves behind
        if fails:
            raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(experiments.subprocess, "run", fake_run)
    results = tmp_path / "rows.jsonl"
    if fails:
        with pytest.raises(subprocess.CalledProcessError):
            experiments.run_row("short-base", results, root=tmp_path)
        assert not results.exists()
    else:
        row = experiments.run_row("short-base", results, root=tmp_path)
        assert json.loads(results.read_text()) == row
    assert params.read_bytes() == edited
    assert [c[:3] for c in commands] == [["dvc", "exp", "run"]]  # no git command, ever


def test_a_row_is_recorded_from_a_workspace_with_its_named_test_sets(tmp_path):
    (tmp_path / "data/eval").mkdir(parents=True)
    (tmp_path / "models").mkdir()
    (tmp_path / "data/eval/stats.json").write_text(json.dumps({
        "bleu": 41.2, "chrf": 36.0, "beam_size": 4, "bleu_ge10w": 28.0,
        "test_sets": {"hsk_dev": {"bleu": 20.1, "chrf": 18.2, "bleu_ge10w": 15.0,
                                  "chrf_ge10w": 14.0, "brevity_penalty": 0.9}}}))
    (tmp_path / "models/train_stats.json").write_text(json.dumps({
        "epochs": 56, "steps": 18100, "train_seconds": 3000.0}))
    results = tmp_path / "rows.jsonl"
    args = ["--results", str(results), "--record", str(tmp_path), "--name", "hsk-x", "--what",
            "a dictionary", "--change", "train.epochs=56", "--wall-minutes", "55.5"]
    result = CliRunner().invoke(experiments.app, args)
    assert result.exit_code == 0, result.output
    row = json.loads(results.read_text())
    assert (row["name"], row["changes"], row["epochs"], row["steps"], row["wall_seconds"]) == (
        "hsk-x", {"train.epochs": "56"}, 56, 18100, 3330.0)
    assert "overrides" not in row  # no `dvc exp run -S` re-runs it
    assert row["test_sets"] == {"hsk_dev": {"bleu": 20.1, "chrf": 18.2, "bleu_ge10w": 15.0,
                                            "chrf_ge10w": 14.0}}
    again = CliRunner().invoke(experiments.app, args)  # a name already there is refused
    assert again.exit_code != 0 and "needs a new --name" in again.output
    assert len(results.read_text().splitlines()) == 1


def test_each_recorded_row_shows_the_overrides_its_command_re_runs():
    # The results page prints a row's overrides from docs/experiments.jsonl, and
    # bench.experiments re-runs ROWS: when the defaults change (params.yaml), both must say
    # the same, or the page names a command that trains something else.
    recorded = common.read_jsonl(REPO / "docs" / "experiments.jsonl")
    drifted = {r["name"]: r["overrides"] for r in recorded if "overrides" in r
               and experiments.ROWS[r["name"]]["overrides"] != r["overrides"]}
    assert not drifted


def test_results_page_is_up_to_date():
    result = subprocess.run([sys.executable, "-m", "bench.results_page", "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_results_page_follows_the_raw_rows(tmp_path):
    results = results_page
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    runs = json.loads((docs / "benchmarks/default_run.json").read_text())
    runs["sittings"][-1]["test"]["bleu"] = 12.34  # one column per run: the last one's
    (docs / "benchmarks/default_run.json").write_text(json.dumps(runs))
    with (docs / "experiments.jsonl").open("a") as fh:
        fh.write(json.dumps({"name": "short-new", "what": "a new row", "bleu": 5.67,
                             "chrf": 8.9, "overrides": {"train.lr": "1e-3"}}) + "\n")
        fh.write(json.dumps({"name": "full-new", "what": "a full row", "bleu": 41.2,
                             "chrf": 35.1, "overrides": {"train.epochs": "9"},
                             "final_valid_bleu": 38.5, "bleu_le6w": 45.0, "bleu_7to9w": 40.1,
                             "bleu_ge10w": 28.3, "epochs": 9, "train_seconds": 600}) + "\n")
        fh.write(json.dumps({"name": "full-zh-en", "what": "other way", "bleu": 20.5,
                             "chrf": 44.0, "overrides": {"pair.source_lang": "zh"},
                             "final_valid_bleu": 19.0, "epochs": 30}) + "\n")
    page = results.render(docs)
    # the other direction is listed with the pairs, not ranked in the en→zh ablation
    pairs = page.split("## Other language pairs")[1]
    assert ("| full-zh-en | other way | `-S pair.source_lang=zh` | 20.5 | 44.0 | 30 epochs |"
            in pairs)
    assert "| full-zh-en |" not in page.split("## Other language pairs")[0]
    assert "**12.34**" in page and "short-new" not in page  # smoke runs: experiments.jsonl only
    assert ("| full-new | a full row | `-S train.epochs=9` | 38.5 | 41.2 | 45.0 | 40.1 | 28.3 | "
            "35.1 | 9 | 10.0 |  |") in page


def test_each_dictionary_recipe_is_held_to_the_targets_against_todays_default(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)

    def row(name: str, test: float, hsk_bleu: float, hsk_chrf: float, seconds: float,
            steps: int | None) -> dict:
        scores = {"bleu": hsk_bleu, "chrf": hsk_chrf, "bleu_ge10w": 9.0, "chrf_ge10w": 9.5}
        return {"name": name, "what": name, "changes": {}, "bleu": test, "chrf": 36.0,
                "final_valid_bleu": 39.0, "train_seconds": seconds, "steps": steps,
                "test_sets": {"hsk_dev": scores, "hsk_test": scores}}

    with (docs / "experiments.jsonl").open("a") as fh:
        for one in (row("hsk-default", 41.5, 15.0, 14.0, 3000, 1000),
                    row("hsk-pays", 41.3, 18.0, 17.5, 3400, None),
                    row("hsk-slow", 41.1, 19.0, 18.0, 3600, 1100)):
            fh.write(json.dumps(one) + "\n")
    page = results_page.render(docs)
    section = page.split("## Everyday sentences and the dictionary (full runs)")[1]
    assert "| hsk-default | hsk-default | 39.0 | 41.5 | 15.0 / 14.0 | 15.0 / 14.0 | 9.0 | 50.0 " \
           "| (today's default) |" in section
    assert ("hsk_test BLEU +3.00 (target +3), chrF +3.50 (+3); test BLEU -0.20 (>= -0.3); "
            "minutes x1.13 (<= 1.15): every target met |") in section
    # the steps ratio where both rows have their steps (minutes drift between sittings)
    assert "test BLEU -0.40 (>= -0.3); minutes x1.20 (<= 1.15, steps x1.10): 2 of 4 missed |" \
        in section


def test_the_run_results_md_puts_in_main_dvc_lock_is_the_one_there():
    # results.md says which default run main's dvc.lock holds; `dvc metrics show` prints the
    # committed metric files, so they must be that run's figures, not another run's
    results = results_page
    runs = json.loads((REPO / "docs/benchmarks/default_run.json").read_text())["sittings"]
    run = runs[results.run_in_main_dvc_lock(runs, "default_run.json")]
    test = json.loads((REPO / "data/eval/metrics.json").read_text())
    train = json.loads((REPO / "models/train_metrics.json").read_text())
    export = json.loads((REPO / "models/export_metrics.json").read_text())
    steps = json.loads((REPO / "models/train_stats.json").read_text())
    assert (test["bleu"], test["chrf"]) == (run["test"]["bleu"], run["test"]["chrf"])
    assert [test[k] for k in ("bleu_le6w", "bleu_7to9w", "bleu_ge10w")] == [
        b["bleu"] for b in run["bleu_by_source_words"]]
    assert (train["train_minutes"], round(train["tokens_per_s"])) == (
        run["train"]["train_minutes"], run["train"]["tokens_per_s"])
    assert (steps["epochs"], steps["steps"]) == (run["train"]["epochs"], run["train"]["steps"])
    assert (export["fp32_bleu"], export["fp32_size_mb"], export["int8_bleu"],
            export["int8_size_mb"]) == (run["export"]["fp32_bleu"], run["export"]["fp32_size_mb"],
                                        run["export"]["int8_bleu"], run["export"]["int8_size_mb"])


def test_row_notes_end_with_one_full_stop():
    results = results_page
    rows = [{"name": "a", "note": "ran once."}, {"name": "b", "note": "ran twice"}, {"name": "c"}]
    assert results.row_notes(rows) == ["- a: ran once.", "- b: ran twice."]


def test_results_page_cites_every_file_it_reads(monkeypatch):
    # An uncited file under docs/benchmarks/ is deleted, so the page names each file it reads.
    results = results_page
    read = []
    load_json = results.load_json
    monkeypatch.setattr(results, "load_json", lambda bench, name: read.append(name)
                        or load_json(bench, name))
    page = results.render()
    assert read and set(read) <= set(results.BENCHMARKS.values())
    for name in results.BENCHMARKS.values():
        assert (REPO / "docs/benchmarks" / name).exists(), name
        assert f"`docs/benchmarks/{name}`" in page, name


def test_results_show_the_last_training_sitting_of_each_cpu(tmp_path):
    # Training speed: the last sitting of each CPU, newest first, a line on how each ran and
    # one table of their rows; earlier sittings on a CPU stay in the file only.
    results = results_page
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    path = docs / "benchmarks" / results.BENCHMARKS["train_speed"]
    data = json.loads(path.read_text())
    cpus = list(dict.fromkeys(one["cpu"] for one in data["sittings"]))
    assert len(cpus) >= 2
    last = json.loads(json.dumps(next(one for one in data["sittings"] if one["cpu"] == cpus[0])))
    last["commit"] = "abc1234"
    for row in last["rows"]:
        row["tokens_per_s"] = 1000 if row["system"].endswith("peer") else 1500
    # a second round's peer fp32 row: ours is against the best of them
    last["rows"].append(dict(last["rows"][0]))
    last["rows"][0]["tokens_per_s"] = 800
    data["sittings"].append(last)
    path.write_text(json.dumps(data))
    section = results.render(docs).split("## Training speed by precision")[1].split("\n## ")[0]
    headings = [line for line in section.splitlines() if line.startswith("- **")]
    newest = results.short_cpu(cpus[0])
    assert len(headings) == len(cpus)
    assert headings[0].startswith(f"- **{newest}**, code at `abc1234`, ")
    ours_fp32 = next(line for line in section.splitlines()
                     if line.startswith(f"| {newest} | ours | fp32"))
    assert "| 1,500 | 1.50 |" in ours_fp32
    earlier = [one for one in data["sittings"][:-1] if one["cpu"] == cpus[0]]
    assert all(f"`{one['commit']}`" not in section for one in earlier)
    seen, expected = {cpus[0]}, []
    for one in reversed(data["sittings"]):  # each other CPU's last sitting, newest first
        if one["cpu"] not in seen:
            seen.add(one["cpu"])
            expected.append(f"- **{results.short_cpu(one['cpu'])}**, code at `{one['commit']}`")
    assert [line.split(", 20")[0] for line in headings[1:]] == expected
    table_cpus = [line.split(" | ")[0].removeprefix("| ") for line in section.splitlines()
                  if line.startswith("| ") and not line.startswith(("| CPU", "|---"))]
    assert list(dict.fromkeys(table_cpus)) == [results.short_cpu(c) for c in
                                               [cpus[0]] + [c for c in dict.fromkeys(
                                                   one["cpu"] for one in reversed(
                                                       data["sittings"])) if c != cpus[0]]]


def test_the_recombined_corpus_is_seeded_and_keeps_translations_aligned(tmp_path):
    source = tmp_path / "base.tsv"
    source.write_text("One.\t一。\tcc-by\nTwo.\t二。\tcc-by\n\nbroken line\n", encoding="utf-8")
    outs = []
    for name in ("a.tsv", "b.tsv"):
        out = tmp_path / name
        result = subprocess.run([sys.executable, "-m", "bench.data_scaling",
                                 "--source", str(source), "--pairs", "50", "--corpus", str(out)],
                                capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr
        outs.append(out.read_text(encoding="utf-8"))
    assert outs[0] == outs[1]  # same seed, same file
    rows = [line.split("\t") for line in outs[0].splitlines()]
    assert len(rows) == 50
    words = {"One.": "一。", "Two.": "二。"}
    for src, tgt in rows:
        assert "".join(words[w] for w in src.split(" ")) == tgt
    assert any(" " in src for src, _ in rows)  # some pairs are recombined


@pytest.mark.parametrize("hub", [False, True], ids=["tsv", "hub"])
def test_benchmark_data_measures_each_stage(tmp_path, hub):
    from toy_corpus import toy_tsv

    source = tmp_path / "toy.tsv"
    source.write_text(toy_tsv(), encoding="utf-8")
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, "-m", "bench.data_scaling",
                             "--source", str(source), "--pairs", "300", "--json", str(out),
                             *(["--hub"] if hub else [])],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["stage"] for r in rows] == ["download", "split", "tokenize"]
    assert all(r["pairs"] == 300 and r["source"] == ("hub" if hub else "tsv") for r in rows)
    assert rows[0].get("same_bytes_as_tsv", True) is True
    # the whole process tree (tokenize's encoding workers) is counted, not only the stage
    assert all(r["peak_tree_rss_mb"] >= r["peak_rss_mb"] for r in rows)
    assert "split" in result.stdout and "peak RSS MB" in result.stdout


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present")
def test_engine_benchmark_on_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    """--device cuda must not quietly time the CPU when no GPU is there."""
    pytest.importorskip("ctranslate2")
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--device", "cuda",
         "--models", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.startswith("error: --device cuda needs a GPU")
    assert "Traceback" not in result.stderr


def write_translations(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    lines = ["source\treference\thypothesis"] + ["\t".join(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def compare_cli(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.paired_significance", *map(str, args),
                           "--target-lang", "zh"], capture_output=True, text=True, timeout=300,
                          cwd=REPO)


def test_compare_finds_the_better_system_and_scores_as_evaluate_does(tmp_path):
    from toy_corpus import toy_pairs

    from src.core.metrics import bleu

    pairs = toy_pairs()[::9]  # 120 pairs
    refs = [zh for _, zh in pairs]
    # A wrong translation: the next pair's (a similar sentence, so partly right). The baseline
    # is wrong in every other sentence, the candidate only in every 20th.
    wrong = refs[1:] + refs[:1]
    base_hyps = [wrong[i] if i % 2 else refs[i] for i in range(len(refs))]
    cand_hyps = [wrong[i] if i % 20 == 0 else refs[i] for i in range(len(refs))]
    base = write_translations(tmp_path / "base.tsv", [(en, zh, h) for (en, zh), h
                                                      in zip(pairs, base_hyps)])
    cand = write_translations(tmp_path / "cand.tsv", [(en, zh, h) for (en, zh), h
                                                      in zip(pairs, cand_hyps)])
    compare = paired_significance
    result = compare.paired_test(base_hyps, cand_hyps, refs, "zh")
    # BLEU as evaluate computes it (zh tokenizer): the same numbers, in the right places
    assert result["BLEU"]["baseline"] == bleu(base_hyps, refs, "zh")
    assert result["BLEU"]["candidate"] == bleu(cand_hyps, refs, "zh")
    assert result["BLEU"]["difference"] > 0 and result["BLEU"]["p_value"] < 0.05

    forward, backward = compare_cli(base, cand), compare_cli(cand, base)
    assert forward.returncode == 0 and backward.returncode == 0, forward.stderr + backward.stderr
    assert forward.stdout.splitlines()[-1].startswith("candidate is better in BLEU")
    assert backward.stdout.splitlines()[-1].startswith("baseline is better in BLEU")
    same = compare_cli(base, base)
    assert same.stdout.splitlines()[-1].startswith("no significant difference")


def test_compare_refuses_translations_of_different_splits(tmp_path):
    a = write_translations(tmp_path / "a.tsv", [("One cat.", "一只猫。", "一只猫。"),
                                                ("Two dogs.", "两只狗。", "两只狗。")])
    b = write_translations(tmp_path / "b.tsv", [("One cat.", "一只猫。", "一只猫。"),
                                                ("Two birds.", "两只鸟。", "两只狗。")])
    result = compare_cli(a, b)
    assert result.returncode == 1
    assert "row 2 has a different source" in result.stderr
    assert "Traceback" not in result.stderr
    missing = compare_cli(a, tmp_path / "nowhere.tsv")
    assert missing.returncode == 1 and "nowhere.tsv not found" in missing.stderr


FAKE_TRAIN = """
import json, os, sys
from pathlib import Path
from types import SimpleNamespace
import yaml
root = Path(os.environ["NMT_ROOT"])
assert os.environ["NMT_TRACKING"] == "off"
assert (root / "data/tokenized/marker").exists() and (root / "models/tokenizer").is_dir()
train = yaml.safe_load((root / "params.yaml").read_text())["train"]
(root / "models/train_stats.json").write_text(json.dumps({
    "precision": train["precision"], "world_size": train["nproc_per_node"],
    "threads": train["threads"], "max_minutes": train["max_minutes"],
    "tokens_per_s": {"fp32": 4000.4, "bf16": 7000.0}[train["precision"]]}))
"""

FAKE_PEER = """
import json, sys
bf16 = "--bf16" in sys.argv
assert sys.argv[sys.argv.index("--thread-test-steps") + 1] == "0"
tok_s = 4000.0 if bf16 else 3000.0
print("# log line")
print("SUMMARY_JSON " + json.dumps({"tok_s": tok_s, "mfu_analytic": 0.25, "peak_gflops": 240.0}))
"""


def test_training_sitting_runs_the_four_rows_and_reads_the_targets(tmp_path, monkeypatch):
    """bench.train_speed_vs_peer with the stage and the peer faked: the rows run in order
    with their overrides, the peer's FLOPs per token come from its summary, the targets are
    judged, and results.py renders the file."""
    import torch

    bench = train_speed_vs_peer
    (tmp_path / "tokenized").mkdir()
    (tmp_path / "tokenized/marker").write_text("")
    (tmp_path / "tokenizer").mkdir()
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  max_minutes: 0\n  precision: auto\n  threads: 0\n"
                      "  nproc_per_node: 1\n")
    monkeypatch.setattr(bench.paths, "TOKENIZED", tmp_path / "tokenized")
    monkeypatch.setattr(bench.paths, "TOKENIZER", tmp_path / "tokenizer")
    monkeypatch.setattr(bench.paths, "PARAMS", params)
    (tmp_path / "train.py").write_text(FAKE_TRAIN)
    monkeypatch.setattr(bench, "TRAIN_COMMAND", [sys.executable, str(tmp_path / "train.py")])
    peaks_read = []
    monkeypatch.setattr(bench, "matmul_peak",
                        lambda dtype, threads: peaks_read.append(dtype) or 100.0)
    monkeypatch.setattr(bench, "cpu_bf16_feature", lambda: "AMX")
    peer = tmp_path / "peer_train.py"
    peer.write_text(FAKE_PEER)
    data = tmp_path / "cmn.txt"
    data.write_text("Hi.\t嗨。\n")
    out = tmp_path / "train_speed.json"
    sittings = tmp_path / "train_speed_sittings.json"
    sittings.write_text(json.dumps({"sittings": [{"commit": "earlier"}]}))
    from typer.testing import CliRunner

    result = CliRunner().invoke(bench.app, [
        "--peer-script", str(peer), "--peer-python", sys.executable, "--peer-data", str(data),
        "--minutes", "0.5", "--set", "train.nproc_per_node=2", "--set", "train.threads=1",
        "--json", str(out), "--append", str(sittings)])
    assert result.exit_code == 0, result.output
    sitting = json.loads(out.read_text())
    assert json.loads(sittings.read_text()) == {"sittings": [{"commit": "earlier"}, sitting]}
    rows = sitting["rows"]
    assert [(r["system"], r["precision"], r["layout"], r["tokens_per_s"]) for r in rows] == [
        ("Hugging Face peer", "fp32", "1 x 2", 3000), ("ours", "fp32", "2 x 1", 4000),
        ("Hugging Face peer", "bf16", "1 x 2", 4000), ("ours", "bf16", "2 x 1", 7000)]
    assert rows[1]["command"] == ("python -m src.train with train.max_minutes=0.5 "
                                  "train.precision=fp32 train.threads=1 "
                                  "train.nproc_per_node=2")
    assert str(tmp_path) not in json.dumps(sitting)  # commands name files, not our folders
    assert rows[0]["command"].startswith("python peer_train.py --data cmn.txt --budget-min 0.5")
    assert sitting["gflop_per_token"] == pytest.approx(0.25 * 240 / 3000)
    # 7000 / 3000 = 2.33 >= 1.6; 7000 / 4000 = 1.75 >= 1.3
    assert sitting["note"].endswith("all met on this CPU.")
    assert "ours bf16 / peer fp32 2.33x (target 1.6)" in sitting["note"]
    assert "ours bf16 / ours fp32 1.75x (target 1.3)" in sitting["note"]
    results = results_page
    rendered = "\n".join(results.training_speed_by_precision([sitting]))
    assert "| ours | bf16 | 2 x 1 |" in rendered and "| 2.33 |" in rendered
    assert peaks_read.count(torch.bfloat16) == 2 and sitting["matmul_peak_gflops"]["bf16"] == 100
    # a CPU without native bf16: its emulated bf16 peak is not timed, the rows still run
    peaks_read.clear()
    monkeypatch.setattr(bench, "cpu_bf16_feature", lambda: None)
    result = CliRunner().invoke(bench.app, [
        "--peer-script", str(peer), "--peer-python", sys.executable, "--peer-data", str(data),
        "--minutes", "0.5", "--json", str(out)])
    assert result.exit_code == 0, result.output
    sitting = json.loads(out.read_text())
    assert peaks_read == [torch.float32, torch.float32]
    assert [(r["system"], r["precision"]) for r in sitting["rows"]] == [
        ("Hugging Face peer", "fp32"), ("ours", "fp32")]  # no emulated bf16 rows
    assert sitting["what"].endswith(" No bf16 rows: the CPU has no native bf16.")
    assert sitting["matmul_peak_gflops"] == {"fp32": 100.0, "bf16": None}
    assert sitting["peak_command"].endswith("bf16 not timed: the CPU has no native bf16)")
    rendered = "\n".join(results.training_speed_by_precision([sitting]))
    assert "| bf16 |" not in rendered and "| 4,000 | 1.33 | 80% of 100.0 GFLOP/s |" in rendered


def test_training_sitting_says_which_target_is_missed():
    bench = train_speed_vs_peer
    rows = [{"system": "Hugging Face peer", "precision": "fp32", "tokens_per_s": 3000},
            {"system": "ours", "precision": "fp32", "tokens_per_s": 5000},
            {"system": "Hugging Face peer", "precision": "bf16", "tokens_per_s": 4000},
            {"system": "ours", "precision": "bf16", "tokens_per_s": 6100},
            {"system": "ours, two ranks", "precision": "bf16", "tokens_per_s": 9000}]
    note = bench.target_note(rows)  # the two-rank row is another recipe: not ours
    assert "ours bf16 / peer fp32 2.03x (target 1.6)" in note
    assert "ours bf16 / ours fp32 1.22x (target 1.3)" in note
    assert note.endswith("1 of 2 met on this CPU.")
    # a CPU without native bf16: every row of ours trained in fp32, the best of them counts
    fp32_only = [r | {"precision": "fp32"} if r["system"] == "ours" else r for r in rows]
    note = bench.target_note(fp32_only, bench.FP32_TARGETS)
    assert note == ("Targets, best row of each kind: ours fp32 / peer fp32 2.03x (target 1.3): "
                    "all met on this CPU.")
    assert bench.target_note(fp32_only).startswith(
        "Targets, best row of each kind: ours bf16 / peer fp32: no row (target 1.6); ")


def test_training_sitting_stops_before_the_peer_runs_when_our_inputs_are_missing(
        tmp_path, monkeypatch):
    bench = train_speed_vs_peer
    monkeypatch.setattr(bench.paths, "TOKENIZED", tmp_path / "tokenized")
    monkeypatch.setattr(bench.paths, "TOKENIZER", tmp_path / "tokenizer")
    ran = tmp_path / "peer_ran"
    peer = tmp_path / "peer_train.py"
    peer.write_text(f"open({str(ran)!r}, 'w')\n" + FAKE_PEER)
    data = tmp_path / "cmn.txt"
    data.write_text("Hi.\t嗨。\n")
    from typer.testing import CliRunner

    result = CliRunner().invoke(bench.app, ["--peer-script", str(peer), "--peer-python",
                                            sys.executable, "--peer-data", str(data)])
    assert result.exit_code == 2 and "run `dvc repro tokenize` first" in result.output
    assert not ran.exists()


def fake_spec(name: str = "fake_engine:EchoEngine") -> dict:
    lines = ["one two", "three", "four five six"]
    return {"engine": name, "precision": "fp32", "threads": 1, "device": "cpu",
            "cells": [[1, 1], [4, 2]], "lines": lines, "keep_outputs": True,
            "lengths": {str(i): len(line.split()) for i, line in enumerate(lines)}}


def test_engine_benchmark_times_each_engine_in_a_process_of_its_own(tmp_path, monkeypatch):
    """The harness imported torch (for the conversion) before CTranslate2, which then ran 5x
    slower at two threads: now every pass runs in a new process that loads neither torch nor
    an engine runtime of its own accord."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    bench = engines_vs_ctranslate2
    first, second = (bench.run_worker(fake_spec(), tmp_path) for _ in range(2))
    assert len({first["pid"], second["pid"], os.getpid()}) == 3
    assert first["modules"] == [] and second["modules"] == []  # no torch, no engine runtime
    assert set(first["seconds"]) == {"1,1", "4,2"}
    assert first["outputs"]["4,2"] == ["ONE TWO", "THREE", "FOUR FIVE SIX"]


def test_ctranslate2_in_the_engine_benchmark_turns_every_hypothesis_into_text():
    """With --n-best ours returns each hypothesis as text; CTranslate2's side decoded only the
    first of each list, so its clock held less work than ours."""
    bench = engines_vs_ctranslate2
    decoded = []

    class Pieces:  # the SentencePiece models of either side
        def encode(self, line, out_type):
            return line.split()

        def decode(self, pieces):
            decoded.append(pieces)
            return "".join(pieces)

    class Translator:  # ctranslate2.Translator: 4 hypotheses a sentence
        def translate_batch(self, tokens, **options):
            return [SimpleNamespace(hypotheses=[["a"], ["b"], ["c"], ["d"]]) for _ in tokens]

    engine = object.__new__(bench.Ct2Engine)
    vars(engine).update(
        source=Pieces(), target=Pieces(), translator=Translator(), eos_piece="</s>",
        meta={"max_length_ratio": "2.0", "max_output_tokens": "50", "max_source_tokens": "20",
              "length_penalty": "1.0"},
        n_best=4, scores=True, force_length=None, target_pieces=[], options=lambda *_: {})
    assert engine.run(["x y", "z"], 4) == ["a", "a"]
    assert sorted(map(tuple, decoded)) == [("a",), ("a",), ("b",), ("b",), ("c",), ("c",),
                                            ("d",), ("d",)]


def test_engine_benchmark_pairs_passes_without_and_with_scores(tmp_path, monkeypatch):
    """--score-cost: one worker times its engine both ways, round after round, and a cell's
    row reports each way's speed and the median of the rounds' scored / plain ratios."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    bench = engines_vs_ctranslate2
    spec = fake_spec("fake_engine:ClockedEngine") | {"score_cost": 3}
    costs = bench.run_worker(spec, tmp_path)["score_cost"]
    # 3 lines: 3 s plain, 9 s with scores, in every round and in batches of 1 or 2
    assert costs["1,1"] == costs["4,2"] == {"plain": 3.0, "scored": 9.0,
                                            "ratios": [1 / 3, 1 / 3, 1 / 3]}
    row = bench.score_cost_row("ours", "int8", 2, 1, 32, 300,
                               {"plain": 0.1, "scored": 0.125, "ratios": [0.95, 0.8, 0.9]})
    assert (row["plain_sent_per_s"], row["scored_sent_per_s"]) == (3000.0, 2400.0)
    assert (row["scored_vs_plain"], row["ratio_range"], row["rounds"]) == (0.9, [0.8, 0.95], 3)
    refused = subprocess.run([sys.executable, "-m", "bench.engines_vs_ctranslate2",
                              "--score-cost", "4", "--scores"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not with --scores" in refused.stderr


def test_engine_benchmark_refuses_to_time_in_a_process_with_torch(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(fake_spec("ctranslate2")))
    code = ("import sys, runpy, torch; sys.argv = [sys.argv[1], '--worker', sys.argv[2]]; "
            "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
    result = subprocess.run([sys.executable, "-c", code, "bench.engines_vs_ctranslate2",
                             str(spec)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: refusing to time ctranslate2: torch is loaded in "
                                     "this process (it slows the engines; run each engine in a "
                                     "process of its own)")


def test_the_train_step_benchmark_switches_one_lever_off_and_back(monkeypatch):
    # `--without` measures a lever of the bf16 CPU step alone: inside levers_off the step runs
    # without it, and afterwards as shipped again.
    import torch

    from src.data.batching import make_batch
    from src.nmt.model import ModelConfig, Transformer
    from src.training import loss as loss_module
    from src.training.validation import token_loss

    bench = train_step_speed
    torch.manual_seed(0)
    model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=1, ffn_dim=32,
                                    dropout=0.0)).train()
    batch = make_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], max_positions=16)
    chunked_calls = []
    chunked = loss_module.ProjectedCrossEntropy.apply
    monkeypatch.setattr(loss_module.ProjectedCrossEntropy, "apply",
                        lambda *args: chunked_calls.append(1) or chunked(*args))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shipped = token_loss(model, batch, 0.1)[0]
        assert model.packs_rows(torch.device("cpu")) and len(chunked_calls) == 1
        with bench.levers_switched(["packed-rows", "chunked-loss"]):
            assert not model.packs_rows(torch.device("cpu"))
            one_product = token_loss(model, batch, 0.1)[0]
            assert len(chunked_calls) == 1  # the projection ran as one product
        assert model.packs_rows(torch.device("cpu"))
        token_loss(model, batch, 0.1)
        assert len(chunked_calls) == 2
    assert one_product.item() == pytest.approx(shipped.item(), rel=2e-2)  # bf16 products
    with pytest.raises(KeyError):
        with bench.levers_switched(["fused-everything"]):
            pass
    # `--with` switches them on in fp32, where the step leaves them off; the loss stays fp32's
    fp32 = token_loss(model, batch, 0.1)[0]
    assert not model.packs_rows(torch.device("cpu")) and len(chunked_calls) == 2
    with bench.levers_switched([], ["packed-rows", "chunked-loss"]):
        assert model.packs_rows(torch.device("cpu"))
        both_on = token_loss(model, batch, 0.1)[0]
        assert len(chunked_calls) == 3
    assert not model.packs_rows(torch.device("cpu"))
    assert both_on.item() == pytest.approx(fp32.item(), rel=1e-5)


def test_the_lever_table_of_training_speed_is_its_file():
    # docs/training_speed.md's table of levers on the EPYC says what its file holds.
    data = json.loads((REPO / "docs/benchmarks/train_levers_epyc_zen5.json").read_text())
    page = (REPO / "docs/training_speed.md").read_text(encoding="utf-8")
    section = page.split("## On an AVX-512 BF16 CPU without AMX")[1].split("\n## ")[0]
    header, _, *lines = [line for line in section.splitlines() if line.startswith("|")]
    variants = [cell.strip() for cell in header.strip("|").split("|")][1:]
    seen = {}
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for variant, cell in zip(variants, cells[1:]):
            seen[int(cells[0]), variant] = cell
    expected = {}
    for row in data["rows"]:
        shipped = next(r["tokens_per_s"] for r in data["rows"]
                       if r["round"] == row["round"] and r["variant"] == "shipped")
        cell = f"{row['tokens_per_s']:,.0f}"
        if row["variant"] != "shipped":
            cell += f" ({row['tokens_per_s'] / shipped - 1:+.1%})"
        expected[row["round"], row["variant"]] = cell
    assert seen == expected
