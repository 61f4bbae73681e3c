"""Translation speed of the trained model: PyTorch without cache, PyTorch with KV cache, ONNX.

Reads models/model.pt, models/model.onnx (and models/model.int8.onnx if present) and the test
split of data/tokenized; prints a Markdown table of sentences/s and the ratio to PyTorch eager
without cache, for batch 1 and 32, greedy and beam 4. Every system decodes the same sentences,
in the same length-sorted batches, with the same search rules and output limit
(`contract.max_new_tokens`), so they do the same work; greedy outputs are identical across
systems (export checks it). Ids in, ids out: tokenizing is left out.

    python scripts/benchmark_infer.py                       # everything, 2 threads
    python scripts/benchmark_infer.py --systems onnx --threads 1,2   # pick infer's default
    python scripts/benchmark_infer.py --json docs/benchmarks/infer_speed.json  # for results.md

Not a test: timings need an otherwise idle machine. Each system at each thread count is timed
in a process of its own, the ONNX ones in a process without torch (as `src.infer` and the
served model run), since one engine's idle worker threads slow another's. Systems:
  torch-nocache  the full decoder re-run over the whole prefix at every step (no KV cache)
  torch-cache    src.search (encode once, cross K/V once, self-attention cache)
  onnx / int8    the single-file model as src.infer runs it (its sessions for one sentence and
                 for batches, search inside the graph)
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from src.core import paths  # noqa: E402
from src.core.special_ids import EOS  # noqa: E402

SYSTEMS = ("torch-nocache", "torch-cache", "onnx", "int8")
TORCH_SYSTEMS = ("torch-nocache", "torch-cache")
LENGTH_PENALTY = 1.0  # both searches' default


def nocache_decoding(model):
    """`src.search`'s model interface, but every step re-decodes the whole prefix.

    The "cache" is the token history (B, T), which beam search reorders like a real cache, so
    both PyTorch systems run the very same search code.
    """
    import torch

    class NoCacheDecoding:
        def __init__(self):
            self.max_positions = model.max_positions

        def encode(self, src):
            return model.encode(src)

        def cross_kv(self, memory):
            return [(memory, memory)]

        def empty_cache(self, batch, device=None, dtype=None):
            empty = torch.zeros(batch, 0, dtype=torch.long, device=device)
            return [(empty, empty)]

        def decode_step(self, tokens, cache, cross, src_mask):
            history = torch.cat([cache[0][0], tokens], dim=1)  # (B, T + 1)
            hidden = model.decode(history, cross[0][0], src_mask)  # (B, T + 1, D)
            return model.generator(hidden[:, -1]), [(history, history)]

    return NoCacheDecoding()


def torch_runner(system: str, model_path: Path, threads: int):
    """(run, source limit, output limit) for a PyTorch system; run(rows, beam) -> ids per row."""
    import torch

    from src.data.batching import pad
    from src.nmt import checkpoint
    from src.nmt.search import beam_search, greedy_search

    torch.set_num_threads(threads)
    model, _ = checkpoint.load_model(model_path)
    print(f"# {model_path}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params",
          flush=True)
    searched = nocache_decoding(model) if system == "torch-nocache" else model

    def run(rows: list[list[int]], beam: int, new_tokens: int):
        src = pad(rows)
        if beam == 1:
            return greedy_search(searched, src, new_tokens, LENGTH_PENALTY)
        return beam_search(searched, src, beam, new_tokens, LENGTH_PENALTY)
    return run, model.max_positions - 1, model.max_positions - 1


def onnx_runner(onnx_path: Path, threads: int):
    """The same for a model file, through the sessions src.infer's translator opens."""
    from src.runtime import contract, generation

    translator = generation.load_translator(onnx_path, provider="cpu", threads=threads)

    def run(rows: list[list[int]], beam: int, new_tokens: int):
        return contract.run_search(translator.session_for(len(rows)),
                                   contract.pad_rows(rows, translator.pad), new_tokens, beam,
                                   LENGTH_PENALTY, translator.pad)
    return (run, translator.source_piece_limit, int(translator.meta["max_output_tokens"]))


def batches(sources: list[list[int]], size: int, source_limit: int) -> list[list[list[int]]]:
    """Length-sorted batches of source rows cut to the model's limit, each + EOS (as evaluate
    and `infer --input` make them)."""
    ordered = sorted(sources, key=len)
    return [[list(s[:source_limit]) + [EOS] for s in ordered[i: i + size]]
            for i in range(0, len(ordered), size)]


def busy_cpu_seconds() -> float:
    """CPU time all processes used so far (Linux /proc/stat; 0 elsewhere)."""
    try:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait


def time_config(run, work: list[list[list[int]]], beam: int, output_limit: int,
                max_seconds: float) -> dict:
    from src.runtime.contract import max_new_tokens

    def new_tokens(rows):
        return max_new_tokens(max(len(r) for r in rows), 2.0, output_limit)

    run(work[0], beam, new_tokens(work[0]))  # warm-up, not timed
    sentences = tokens = 0
    busy, own = busy_cpu_seconds(), time.process_time()
    start = time.perf_counter()
    for rows in work:
        out = run(rows, beam, new_tokens(rows))
        sentences += len(out)
        tokens += sum(len(o) + 1 for o in out)  # + EOS
        if time.perf_counter() - start > max_seconds:
            break
    seconds = time.perf_counter() - start
    # CPUs' worth of time other processes used meanwhile: > 0.1 means a contended number.
    foreign = max(0.0, busy_cpu_seconds() - busy - (time.process_time() - own)) / seconds
    return {"sentences": sentences, "sent_s": sentences / seconds, "tok_s": tokens / seconds,
            "foreign_cpu": foreign}


def load_sources(split_dir: Path, n: int) -> list[list[int]]:
    from datasets import load_from_disk

    return list(load_from_disk(str(split_dir))["test"]["source_ids"])[:n]


def worker(a: argparse.Namespace) -> None:
    """One system at one thread count, in this process: its rows as JSON to `--rows-out`."""
    system, threads = a.worker, int(a.threads)
    if system in TORCH_SYSTEMS:
        run, source_limit, output_limit = torch_runner(system, a.model, threads)
    else:
        run, source_limit, output_limit = onnx_runner(a.onnx if system == "onnx" else a.int8,
                                                      threads)
        if "torch" in sys.modules:
            sys.exit(f"benchmark_infer: torch was imported in the {system} process; "
                     "ONNX Runtime is timed without it")
    sources = load_sources(a.data, max(a.n, a.n1))
    rows = []
    for beam in (int(b) for b in a.beams.split(",")):
        for size in (int(b) for b in a.batches.split(",")):
            work = batches(sources[: a.n1 if size == 1 else a.n], size, source_limit)
            r = time_config(run, work, beam, output_limit, a.max_seconds)
            rows.append({"system": system, "threads": threads, "beam": beam, "batch": size, **r})
            print(f"  {system:<13} threads={threads} beam={beam} batch={size:<3} "
                  f"{r['sent_s']:8.2f} sent/s ({r['sentences']} sentences, "
                  f"foreign CPU {r['foreign_cpu']:.2f})", flush=True)
    Path(a.rows_out).write_text(json.dumps(rows), encoding="utf-8")


def timed_in_own_process(argv: list[str], system: str, threads: int) -> list[dict]:
    """Re-runs this script, with the command line it was given, as the worker of one system at
    one thread count (argparse keeps the last --threads)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, __file__, *argv, "--worker", system,
                        "--threads", str(threads), "--rows-out", str(out)], check=True)
        return json.loads(out.read_text(encoding="utf-8"))


def write_json(path: Path, rows: list[dict], command: str, model: str) -> None:
    """The rows with what produced them, in the shape scripts/results.py renders."""
    from scripts.benchmark_training import cpu_description  # torch: after the timed processes

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.ROOT,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    doc = {"what": "Translation speed of models/model.onnx and PyTorch, sentences/s on test "
                   "sentences", "command": command, "commit": commit, "model": model,
           "machine": cpu_description(), "date": time.strftime("%Y-%m-%d"),
           "rows": [{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                    for r in rows]}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"# wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=paths.MODELS / "model.pt")
    p.add_argument("--onnx", type=Path, default=paths.ONNX_MODEL)
    p.add_argument("--int8", type=Path, default=paths.ONNX_INT8_MODEL)
    p.add_argument("--data", type=Path, default=paths.TOKENIZED)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--beams", default="1,4")
    p.add_argument("--threads", default="2",
                   help="comma list; ONNX systems run at each, PyTorch at the largest")
    p.add_argument("--n", type=int, default=256, help="sentences for batched runs")
    p.add_argument("--n1", type=int, default=64, help="sentences for batch-1 runs")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="per configuration; stops after the batch that crosses it")
    p.add_argument("--json", type=Path, default=None,
                   help="also write the rows here (docs/benchmarks/infer_speed.json feeds "
                        "scripts/results.py)")
    p.add_argument("--model-note", default=None,
                   help="which model this is, for the JSON (default: --model's path)")
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--rows-out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    systems = a.systems.split(",")
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    threads = [int(t) for t in a.threads.split(",")]
    print(f"# cpu_count={os.cpu_count()}; load average before {os.getloadavg()[0]:.2f}",
          flush=True)
    rows = []
    for system in systems:
        if system == "int8" and not a.int8.exists():
            print(f"# skipping int8: {a.int8} not found (export.quantize: false?)")
            continue
        for t in [max(threads)] if system in TORCH_SYSTEMS else threads:
            rows += timed_in_own_process(sys.argv[1:], system, t)
    if a.json:
        command = shlex.join(["python", "scripts/benchmark_infer.py", *sys.argv[1:]])
        write_json(a.json, rows, command, a.model_note or str(a.model))
    base = {(r["beam"], r["batch"]): r["sent_s"] for r in rows if r["system"] == "torch-nocache"}
    print("\n| system | threads | beam | batch | sent/s | tok/s | x torch-nocache | foreign CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = base.get((r["beam"], r["batch"]))
        ratio_text = f"{r['sent_s'] / ratio:.2f}" if ratio else "n/a"
        print(f"| {r['system']} | {r['threads']} | {r['beam']} | {r['batch']} | "
              f"{r['sent_s']:.2f} | {r['tok_s']:.1f} | {ratio_text} | {r['foreign_cpu']:.2f} |")


if __name__ == "__main__":
    main()
