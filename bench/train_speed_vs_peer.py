"""Training speed beside the Hugging Face peer, fp32 and bf16, and the matmul peaks, in one
sitting appended to docs/benchmarks/train_speed_sittings.json: docs/training_speed.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import typer
import yaml

from bench import common
from bench.common import PEER, REPO, append_sitting, best_speed, write_json
from src.core import paths
from src.training.precision import cpu_bf16_feature

app = common.cli_app()

TRAIN_COMMAND = [sys.executable, "-m", "src.train"]
# The ratios a sitting is held to (system, precision, against system, precision, at least).
# Where the CPU multiplies bf16 natively: ours bf16 against the peer's fp32 and against our own
# fp32. Elsewhere (an AVX2 laptop, say) both train in fp32: ours against the peer's.
BF16_TARGETS = (("ours", "bf16", PEER, "fp32", 1.6),
                ("ours", "bf16", "ours", "fp32", 1.3))
FP32_TARGETS = (("ours", "fp32", PEER, "fp32", 1.3),)


def matmul_peak(dtype: torch.dtype, threads: int, size: int = 2048, reps: int = 10) -> float:
    """Best GFLOP/s of torch.mm on two size x size matrices of `dtype`."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def parse_sets(sets: list[str]) -> dict[str, str]:
    out = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("train."):
            raise typer.BadParameter(f"expected train.<key>=<value>, got {item!r}")
        out[key] = value
    return out


def workspace_inputs() -> list[tuple[Path, str]]:
    """What our rows train on (the workspace's encoded data and tokenizer) and where it goes in
    the scratch folder; a missing one stops the sitting before any row runs."""
    inputs = [(paths.TOKENIZED, "data/tokenized"), (paths.TOKENIZER, "models/tokenizer")]
    for source, _ in inputs:
        if not source.exists():
            raise typer.BadParameter(f"{source} is missing: run `dvc repro tokenize` first "
                                     "(or set NMT_ROOT to a workspace that has it)")
    return inputs


def run_ours(precision: str, minutes: float, threads: int, sets: dict[str, str]) -> dict:
    """The train stage for `minutes` of training in a scratch copy of the workspace's inputs."""
    params = common.read_params(paths.PARAMS)
    overrides = {"train.max_minutes": minutes, "train.precision": precision,
                 "train.threads": threads} | {k: yaml.safe_load(v) for k, v in sets.items()}
    for key, value in overrides.items():
        section, name = key.split(".", 1)
        if name not in params[section]:
            raise typer.BadParameter(f"params.yaml has no {key}")
        params[section][name] = value
    with tempfile.TemporaryDirectory(prefix="train_speed_") as tmp:
        scratch = Path(tmp)
        for source, rel in workspace_inputs():
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            (scratch / rel).symlink_to(source)
        common.write_params(scratch / "params.yaml", params)
        done = subprocess.run(TRAIN_COMMAND, cwd=REPO, env=common.project_env(scratch),
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"train stage failed:\n{done.stderr[-2000:]}")
        stats = json.loads((scratch / "models" / "train_stats.json").read_text())
    command = " ".join(["python -m src.train with"]
                       + [f"{k}={v}" for k, v in overrides.items()])
    world, per_rank = stats["world_size"], stats["threads"]
    return {"system": "ours", "precision": stats["precision"],
            "layout": f"{world} x {per_rank}", "command": command,
            "allocator": stats.get("allocator", ""), "tokens_per_s": round(stats["tokens_per_s"])}


def run_peer(script: Path, python: Path, data: Path, minutes: float, threads: int,
             bf16: bool) -> tuple[dict, dict]:
    """peer_train.py for `minutes` of training at `threads` threads: its row and its summary."""
    args = ["--data", str(data), "--budget-min", str(minutes), "--final-limit", "50",
            "--thread-test-steps", "0", "--threads", str(threads)] + (["--bf16"] if bf16 else [])
    with tempfile.TemporaryDirectory(prefix="peer_train_") as tmp:
        done = subprocess.run([str(python), str(script.resolve()), *args,
                               "--workdir", tmp, "--log", str(Path(tmp) / "log.txt")],
                              cwd=tmp, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SUMMARY_JSON ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{script.name} failed:\n{(done.stderr or done.stdout)[-2000:]}")
    summary = json.loads(lines[-1].removeprefix("SUMMARY_JSON "))
    shown = " ".join(a if a != str(data) else data.name for a in args)
    row = {"system": PEER, "precision": "bf16" if bf16 else "fp32",
           "layout": f"1 x {threads}", "command": f"python {script.name} {shown}",
           "tokens_per_s": round(summary["tok_s"])}
    return row, summary


def gflop_per_token(summary: dict) -> float:
    """The peer's analytic FLOPs per non-pad token (linears and attention, 3 x forward)."""
    return summary["mfu_analytic"] * summary["peak_gflops"] / summary["tok_s"]


def target_note(rows: list[dict], targets=BF16_TARGETS) -> str:
    """The targets' ratios, each from the best row of its kind; a kind without a row (our
    bf16 rows train in fp32 on a CPU without native bf16) is said to be missing."""
    parts, met = [], []
    for system, precision, against, against_precision, goal in targets:
        name = "peer" if against == PEER else against
        pair = f"{system} {precision} / {name} {against_precision}"
        mine, theirs = best_speed(rows, system, precision), best_speed(rows, against,
                                                                    against_precision)
        if mine is None or theirs is None:
            parts.append(f"{pair}: no row (target {goal})")
            met.append(False)
            continue
        ratio = mine / theirs
        parts.append(f"{pair} {ratio:.2f}x (target {goal})")
        met.append(ratio >= goal)
    verdict = "all met" if all(met) else f"{sum(met)} of {len(met)} met"
    return f"Targets, best row of each kind: {'; '.join(parts)}: {verdict} on this CPU."


@app.command()
def main(
    peer_script: Path = typer.Option(..., exists=True, dir_okay=False,
                                     help="The peer benchmark's peer_train.py."),
    peer_python: Path = typer.Option(..., exists=True, dir_okay=False,
                                     help="Python of the peer's own venv (transformers etc.)."),
    peer_data: Path = typer.Option(..., exists=True, dir_okay=False,
                                   help="The corpus file the peer reads (cmn.txt)."),
    minutes: float = typer.Option(3.0, help="Training minutes of each row."),
    threads: int = typer.Option(2, help="Threads of every row."),
    rounds: int = typer.Option(1, help="Repeat the rows this many times (peer and "
                        "ours in fp32, then in bf16 where the CPU has native bf16)."),
    set_: list[str] = typer.Option([], "--set", help="train.<key>=<value> for our rows."),
    json_out: Path = typer.Option(None, "--json", help="Write the sitting here."),
    append: Path = typer.Option(None, help="Append the sitting to this sittings file "
                                           '({"sittings": [...]}; made if missing).'),
) -> None:
    sets = parse_sets(set_)
    workspace_inputs()  # before the peer's rows, not after them
    peaks = {"fp32": [], "bf16": []}
    # bf16 products on a CPU without native bf16 are emulated: minutes per reading, and no
    # peak a bf16 row could be held to
    timed = {"fp32": torch.float32} | ({"bf16": torch.bfloat16} if cpu_bf16_feature() else {})

    def read_peaks() -> None:
        for name, dtype in timed.items():
            peaks[name].append(round(matmul_peak(dtype, threads), 1))

    read_peaks()
    rows, per_token = [], None
    # Without native bf16, the peer's bf16 is emulated (about 115 tokens/s on an AVX2 EPYC)
    # and ours falls back to fp32: minutes for rows that say nothing new
    precisions = ("fp32", "bf16") if "bf16" in timed else ("fp32",)
    for _ in range(rounds):
        for precision in precisions:
            peer, summary = run_peer(peer_script, peer_python, peer_data, minutes, threads,
                                     precision == "bf16")
            if precision == "fp32" and per_token is None:
                per_token = gflop_per_token(summary)
            ours = run_ours(precision, minutes, threads, sets)
            for row in (peer, ours):
                rows.append(row)
                print(json.dumps(row), flush=True)
    read_peaks()
    # the command is in `what`, without the peer's paths: no "command" of this machine's folders
    sitting = dict(
        what=(f"Training speed side by side in one sitting, idle machine, {minutes:g} minutes "
                 f"of training each, {threads} threads, same dims (d256, 3+3 layers, FFN 1024, "
                 "shared 8k vocabulary), tokens = non-pad source + target incl. EOS. Peer rows: "
                 "its whole run at that thread count (no thread test). Ours: the train stage on "
                 "the default recipe's first (bidirectional) epoch. Shares use the peer's "
                 f"analytic FLOPs per token ({per_token * 1e3:.2f} MFLOP) against the best "
                 "torch.mm reading of the sitting at that precision. Rows in the order they ran: "
                 f"`python -m bench.train_speed_vs_peer --minutes {minutes:g} --rounds {rounds}"
                 + "".join(f" --set {k}={v}" for k, v in sets.items()) + "`."
                 + ("" if "bf16" in timed else " No bf16 rows: the CPU has no native bf16.")),
        cpu=common.cpu_description(), date=time.strftime("%Y-%m-%d"), commit=common.commit(),
        peak_command=f"torch.mm 2048x2048, {threads} threads, best of 10, before and after "
                     f"the rows ({peaks['fp32']} fp32, "
                     + (f"{peaks['bf16']} bf16)" if peaks["bf16"]
                        else "bf16 not timed: the CPU has no native bf16)"),
        matmul_peak_gflops={k: max(v) if v else None for k, v in peaks.items()},
        gflop_per_token=round(per_token, 6), rows=rows,
        note=target_note(rows, BF16_TARGETS if cpu_bf16_feature() else FP32_TARGETS))
    print(sitting["note"])
    if json_out:
        write_json(json_out, sitting)
    if append:
        append_sitting(append, sitting)


if __name__ == "__main__":
    common.run_cli(app)
