"""Translation speed of the trained model, ids in and out: PyTorch without and with KV cache,
model.onnx and int8, each system and thread count in a process of its own, sent/s for batch 1
and 32, greedy and beam 4: docs/results.md ("Translation speed"),
docs/benchmarks/infer_speed.json.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import typer

from bench import common
from bench.common import ints
from src.core import paths
from src.core.special_ids import EOS
from src.runtime.length_batches import length_batches

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
    """The translators' length-sorted batches (src.runtime.length_batches, by source tokens;
    ids, so no line counts as blank) of source rows cut to the model's limit, each + EOS."""
    order = length_batches(["ids"] * len(sources), size, dict(enumerate(map(len, sources))))
    return [[list(sources[i][:source_limit]) + [EOS] for i in idx] for idx in order]


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


def worker(spec: dict) -> list[dict]:
    """One system at one thread count, in this process: its rows."""
    system, threads = spec["system"], spec["threads"]
    if system in TORCH_SYSTEMS:
        run, source_limit, output_limit = torch_runner(system, Path(spec["model"]), threads)
    else:
        run, source_limit, output_limit = onnx_runner(Path(spec[system]), threads)
        if "torch" in sys.modules:
            sys.exit(f"translation_speed: torch was imported in the {system} process; "
                     "ONNX Runtime is timed without it")
    n, n1 = spec["n"], spec["n1"]
    sources = list(common.test_split(Path(spec["data"]))["source_ids"])[:max(n, n1)]
    rows = []
    for beam in ints(spec["beams"]):
        for size in ints(spec["batches"]):
            work = batches(sources[: n1 if size == 1 else n], size, source_limit)
            r = time_config(run, work, beam, output_limit, spec["max_seconds"])
            rows.append({"system": system, "threads": threads, "beam": beam, "batch": size, **r})
            print(f"  {system:<13} threads={threads} beam={beam} batch={size:<3} "
                  f"{r['sent_s']:8.2f} sent/s ({r['sentences']} sentences, "
                  f"foreign CPU {r['foreign_cpu']:.2f})", file=sys.stderr, flush=True)
    return rows


app = common.cli_app()


@app.command(help=__doc__)
def main(
    model: Path = typer.Option(paths.MODELS / "model.pt"),
    onnx: Path = typer.Option(paths.ONNX_MODEL),
    int8: Path = typer.Option(paths.ONNX_INT8_MODEL),
    data: Path = typer.Option(paths.TOKENIZED),
    systems: str = typer.Option(",".join(SYSTEMS)),
    batches: str = typer.Option("1,32"),
    beams: str = typer.Option("1,4"),
    threads: str = typer.Option("2", help="Comma list; ONNX systems run at each, PyTorch at the "
                                "largest."),
    n: int = typer.Option(256, "--n", help="Sentences for batched runs."),
    n1: int = typer.Option(64, "--n1", help="Sentences for batch-1 runs."),
    max_seconds: float = typer.Option(60.0, help="Per configuration."),
    json_out: Path = typer.Option(None, "--json", help="Also write the rows here."),
    model_note: str = typer.Option(None, help="Which model this is, for the JSON."),
    worker_spec: Path = typer.Option(None, "--worker", hidden=True),
) -> None:
    if worker_spec:
        return common.serve_worker(worker_spec, worker)
    chosen = common.chosen(systems, SYSTEMS, "--systems", "system")
    counts = ints(threads)
    print(f"# cpu_count={os.cpu_count()}; load average before {os.getloadavg()[0]:.2f}",
          flush=True)
    spec = {"model": str(model), "onnx": str(onnx), "int8": str(int8), "data": str(data),
            "n": n, "n1": n1, "beams": beams, "batches": batches, "max_seconds": max_seconds}
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for system in chosen:
            if system == "int8" and not int8.exists():
                print(f"# skipping int8: {int8} not found (export.quantize: false?)")
                continue
            for count in [max(counts)] if system in TORCH_SYSTEMS else counts:
                rows += common.run_worker("bench.translation_speed",
                                          spec | {"system": system, "threads": count}, Path(work))
    if json_out:  # the machine's description imports torch: after the timed processes
        common.write_json(json_out, common.record(
            what="Translation speed of models/model.onnx and PyTorch, sentences/s on test "
                 "sentences", model=model_note or str(model),
            rows=[{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                  for r in rows]))
        print(f"# wrote {json_out}")
    base = {(r["beam"], r["batch"]): r["sent_s"] for r in rows if r["system"] == "torch-nocache"}
    print("\n" + "\n".join(common.markdown_table(
        ["system", "threads", "beam", "batch", "sent/s", "tok/s", "x torch-nocache",
         "foreign CPU"],
        [[r["system"], r["threads"], r["beam"], r["batch"], f"{r['sent_s']:.2f}",
          f"{r['tok_s']:.1f}",
          f"{r['sent_s'] / base[r['beam'], r['batch']]:.2f}" if base.get(
              (r["beam"], r["batch"])) else "n/a", f"{r['foreign_cpu']:.2f}"] for r in rows])))


if __name__ == "__main__":
    common.run_cli(app)
