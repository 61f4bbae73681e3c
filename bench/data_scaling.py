"""Seconds and peak memory of the data stages (download, split, tokenize, and optionally
training steps) as the corpus grows, on corpora recombined from a real one (1-3 pairs joined,
seeded: to measure the stages, not to train on) in scratch projects: docs/scaling.md,
docs/benchmarks/data_scaling_sittings.json.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import typer

from bench import common
from bench.common import REPO, ints
from src.core.text import read_lines

app = common.cli_app()


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """The (source, target) of each line whose first two columns are not blank."""
    cols = (line.split("\t") for line in read_lines(path))
    return [(c[0].strip(), c[1].strip()) for c in cols if len(c) >= 2 and c[0].strip()
            and c[1].strip()]


def write_corpus(path: Path, pairs: list[tuple[str, str]], n: int) -> None:
    """`n` pairs, each 1-3 of `pairs` drawn with seed 0 and joined (targets without a space, as
    Chinese is written), as a TSV."""
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(n):
            parts = [pairs[rng.randrange(len(pairs))] for _ in range(rng.choice((1, 1, 2, 3)))]
            fh.write(" ".join(s for s, _ in parts) + "\t" + "".join(t for _, t in parts) + "\n")


def tree_rss_mb(proc: psutil.Process) -> float:
    """Resident memory of a process and all its children (encoding workers, ranks), MB."""
    total = 0
    for member in [proc, *proc.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:  # ended between listing and reading
            pass
    return total / 2**20


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS of the largest single process (wait4's rusage, exact), and the
    peak of the whole process tree's RSS (sampled every 0.1 s), in MB."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    peak_tree, done = 0.0, threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        watched = psutil.Process(proc.pid)
        while not done.wait(0.1):
            try:
                peak_tree = max(peak_tree, tree_rss_mb(watched))
            except psutil.Error:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {proc.stderr.read().decode()[-500:]}")
    largest = usage.ru_maxrss / 1024  # Linux reports KB
    return seconds, largest, max(peak_tree, largest)


HUB_ID = "bench/corpus"
HUB_README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
---
"""


def hub_snapshot(corpus: Path, cache: Path) -> dict:
    """Put the TSV `corpus` into the Hub cache `cache` as the dataset repo HUB_ID (branch main):
    parquet with columns en and zh, written in row groups. Returns the corpus's `hub:` params."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    snapshot = cache / f"datasets--{HUB_ID.replace('/', '--')}" / "snapshots" / ("0" * 40)
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "README.md").write_text(HUB_README, encoding="utf-8")
    schema = pa.schema([("en", pa.string()), ("zh", pa.string())])
    with corpus.open(encoding="utf-8") as fh, \
            pq.ParquetWriter(snapshot / "data/train-00000-of-00001.parquet", schema) as writer:
        while rows := [line.rstrip("\n").split("\t")[:2] for _, line in zip(range(100_000), fh)]:
            writer.write_table(pa.table({"en": [r[0] for r in rows], "zh": [r[1] for r in rows]},
                                        schema=schema))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    return {"id": HUB_ID, "split": "train", "revision": "main", "columns": ["en", "zh"]}


def scratch_project(root: Path, corpus: Path, pairs: int, train_steps: int,
                    hub: dict | None = None) -> None:
    params = common.read_params(REPO / "params.yaml")
    params["download"]["url"] = str(corpus)
    if hub:
        params["download"].update(url="", corpora=[{"name": "corpus", "hub": hub}])
    split = params["split"]
    if pairs < 20 * (split["valid_size"] + split["test_size"]):  # tiny runs (the test)
        split.update(valid_size=0.05, test_size=0.05)
    params["train"].update(max_steps=max(train_steps, 1), epochs=1)
    common.write_params(root / "params.yaml", params)


@app.command()
def main(
    source: Path = typer.Option(..., help="A TSV corpus to recombine (e.g. cmn.txt)."),
    pairs: str = typer.Option("100000,1000000", help="Comma-separated corpus sizes."),
    train_steps: int = typer.Option(0, min=0, help="Also time this many training steps."),
    json_out: Path = typer.Option(None, "--json", help="Also write the rows here."),
    hub: bool = typer.Option(False, "--hub", help="Read it as a Hub dataset, offline."),
    corpus_out: Path = typer.Option(None, "--corpus", help="Only write the corpus of one size "
                                    "here, to try the stages on; nothing is timed."),
) -> None:
    """Print pairs, stage, seconds and peak RSS for download, split and tokenize."""
    base, sizes = read_pairs(source), ints(pairs)
    if not base:
        raise typer.BadParameter(f"{source} holds no tab-separated pair", param_hint="--source")
    if corpus_out:
        if len(sizes) != 1:
            raise typer.BadParameter("one size with --corpus", param_hint="--pairs")
        write_corpus(corpus_out, base, sizes[0])
        print(f"wrote {sizes[0]:,} pairs to {corpus_out}")
        return
    stages = ["download", "split", "tokenize"] + (["train"] if train_steps else [])
    module = {"tokenize": "src.tokenize_corpus"}
    rows = []
    print(f"{'pairs':>10} {'stage':<9} {'seconds':>8} {'peak RSS MB':>12} {'all processes':>14}")
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="nmt-bench-") as tmp:
            root = Path(tmp)
            corpus = root / "corpus.tsv"
            write_corpus(corpus, base, size)
            source_params = hub_snapshot(corpus, root / "hub") if hub else None
            scratch_project(root, corpus, size, train_steps, source_params)
            env = common.project_env(root)
            if hub:
                env |= {"HF_HUB_CACHE": str(root / "hub"), "HF_HUB_OFFLINE": "1",
                        "HF_HOME": str(root / "hf_home")}
            for stage in stages:
                cmd = [sys.executable, "-m", module.get(stage, f"src.{stage}")]
                seconds, rss_mb, tree_mb = run_measured(cmd, env)
                rows.append({"pairs": size, "source": "hub" if hub else "tsv", "stage": stage,
                             "seconds": round(seconds, 1),
                             "peak_rss_mb": round(rss_mb), "peak_tree_rss_mb": round(tree_mb)})
                print(f"{size:>10,} {stage:<9} {seconds:>8.1f} {rss_mb:>12,.0f} "
                      f"{tree_mb:>14,.0f}", flush=True)
                if hub and stage == "download":  # the Hub path must write the TSV's very bytes
                    same = (root / "data/raw/corpus.tsv").read_bytes() == corpus.read_bytes()
                    rows[-1]["same_bytes_as_tsv"] = same
                    print(f"{'':>10} the Hub corpus is the TSV byte for byte: {same}")
    if json_out:
        common.write_json(json_out, {"command": common.command(), "rows": rows})


if __name__ == "__main__":
    common.run_cli(app)
