"""Translation speed of the trained model: PyTorch without cache, PyTorch with KV cache, ONNX.

Reads models/model.pt, models/model.onnx (and models/model.int8.onnx if present) and the test
split of data/tokenized; prints a Markdown table of sentences/s and the ratio to PyTorch eager
without cache, for batch 1 and 32, greedy and beam 4. Every system decodes the same sentences
with the same search rules and output limit (src.search.max_output_length), so they do the same
work; greedy outputs are identical across systems (export checks it).

    python scripts/benchmark_infer.py                       # everything, 2 threads
    python scripts/benchmark_infer.py --systems onnx --threads 1,2   # pick infer's default
    python scripts/benchmark_infer.py --json docs/benchmarks/infer_speed.json  # for results.md

Not a test: timings need an otherwise idle machine. Systems:
  torch-nocache  the full decoder re-run over the whole prefix at every step (no KV cache)
  torch-cache    src.search (encode once, cross K/V once, self-attention cache)
  onnx / int8    the single-file model through ONNX Runtime (search inside the graph)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from src.core import paths  # noqa: E402
from src.data.batching import clip_source, pad  # noqa: E402
from src.nmt import checkpoint
from src.nmt.search import beam_search, greedy_search, max_output_length  # noqa: E402
from src.runtime import contract, sessions


class NoCacheDecoding:
    """`src.search`'s model interface, but every step re-decodes the whole prefix.

    The "cache" is the token history (B, T), which beam search reorders like a real cache, so
    both PyTorch systems run the very same search code.
    """

    def __init__(self, model):
        self.model = model
        self.max_positions = model.max_positions

    def encode(self, src):
        return self.model.encode(src)

    def cross_kv(self, memory):
        return [(memory, memory)]

    def empty_cache(self, batch, device=None, dtype=None):
        empty = torch.zeros(batch, 0, dtype=torch.long, device=device)
        return [(empty, empty)]

    def decode_step(self, tokens, cache, cross, src_mask):
        history = torch.cat([cache[0][0], tokens], dim=1)  # (B, T + 1)
        hidden = self.model.decode(history, cross[0][0], src_mask)  # (B, T + 1, D)
        return self.model.generator(hidden[:, -1]), [(history, history)]


def torch_runner(model):
    def run(src, beam, max_len):
        if beam == 1:
            return greedy_search(model, src, max_len)
        return beam_search(model, src, beam, max_len)
    return run


def onnx_runner(path: Path, threads: int):
    session = sessions.open_session(path, "cpu", threads)  # as src.infer opens it

    def run(src, beam, max_len):
        return contract.run_search(session, src.numpy(), max_len, beam, 1.0)
    return run


def batches(sources: list[list[int]], size: int, max_positions: int) -> list[torch.Tensor]:
    """Length-sorted batches (as evaluate and infer --input make them)."""
    ordered = sorted(sources, key=len)
    return [pad([clip_source(s, max_positions) for s in ordered[i: i + size]])
            for i in range(0, len(ordered), size)]


def busy_cpu_seconds() -> float:
    """CPU time all processes used so far (Linux /proc/stat; 0 elsewhere)."""
    try:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait


def time_config(run, work: list[torch.Tensor], beam: int, model, max_seconds: float) -> dict:
    run(work[0], beam, max_output_length(work[0], 2.0, model))  # warm-up, not timed
    sentences = tokens = 0
    busy, own = busy_cpu_seconds(), time.process_time()
    start = time.perf_counter()
    for src in work:
        out = run(src, beam, max_output_length(src, 2.0, model))
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


def write_json(path: Path, rows: list[dict], command: str) -> None:
    """The rows with what produced them, in the shape scripts/results.py renders."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.ROOT,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    doc = {"what": "Translation speed of models/model.onnx and PyTorch, sentences/s on test "
                   "sentences", "command": command, "commit": commit,
           "date": time.strftime("%Y-%m-%d"),
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
    p.add_argument("--systems", default="torch-nocache,torch-cache,onnx,int8")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--beams", default="1,4")
    p.add_argument("--threads", default="2", help="comma list; ONNX systems run at each")
    p.add_argument("--n", type=int, default=256, help="sentences for batched runs")
    p.add_argument("--n1", type=int, default=64, help="sentences for batch-1 runs")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="per configuration; stops after the batch that crosses it")
    p.add_argument("--json", type=Path, default=None,
                   help="also write the rows here (docs/benchmarks/infer_speed.json feeds "
                        "scripts/results.py)")
    a = p.parse_args()
    systems = a.systems.split(",")
    threads = [int(t) for t in a.threads.split(",")]
    torch.set_num_threads(max(threads))
    model, _ = checkpoint.load_model(a.model)
    sources = load_sources(a.data, max(a.n, a.n1))
    print(f"# {a.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params; "
          f"{len(sources)} test sentences; cpu_count={os.cpu_count()}; "
          f"load average before {os.getloadavg()[0]:.2f}", flush=True)
    runners = {"torch-nocache": lambda t: torch_runner(NoCacheDecoding(model)),
               "torch-cache": lambda t: torch_runner(model),
               "onnx": lambda t: onnx_runner(a.onnx, t),
               "int8": lambda t: onnx_runner(a.int8, t)}
    rows = []
    for system in systems:
        if system == "int8" and not a.int8.exists():
            print(f"# skipping int8: {a.int8} not found (export.quantize: false?)")
            continue
        for t in threads if system in {"onnx", "int8"} else [max(threads)]:
            if system.startswith("torch"):
                torch.set_num_threads(t)
            run = runners[system](t)
            for beam in (int(b) for b in a.beams.split(",")):
                for size in (int(b) for b in a.batches.split(",")):
                    work = batches(sources[: a.n1 if size == 1 else a.n], size,
                                   model.max_positions)
                    r = time_config(run, work, beam, model, a.max_seconds)
                    rows.append({"system": system, "threads": t, "beam": beam, "batch": size,
                                 **r})
                    print(f"  {system:<13} threads={t} beam={beam} batch={size:<3} "
                          f"{r['sent_s']:8.2f} sent/s ({r['sentences']} sentences, "
                          f"foreign CPU {r['foreign_cpu']:.2f})", flush=True)
    if a.json:
        write_json(a.json, rows, " ".join(["python", "scripts/benchmark_infer.py", *sys.argv[1:]]))
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
