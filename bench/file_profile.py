"""Where an exported file spends a translation: ONNX Runtime's profiler, summed by operator or
node against the time in `session.run` (control nodes apart): docs/engines.md,
docs/benchmarks/profile_beam4_batch1_epyc.txt.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

from bench.common import cli_app, run_cli, test_split, timed
from src.core import paths

app = cli_app()
CONTROL = ("BeamSearch", "Loop", "If")


@app.command()
def main(
    model: Path = typer.Argument(..., help="An exported generation model (model.onnx, ...)."),
    beam: int = typer.Option(4, min=1),
    batch: int = typer.Option(32, min=1, help="Sentences per session.run."),
    threads: int = typer.Option(1, min=1),
    sentences: int = typer.Option(500, min=1, help="The first N test sentences."),
    split_dir: Path = typer.Option(paths.TOKENIZED, help="The stored splits (test)."),
    by: str = typer.Option("op", help="op: sum by operator type; node: by node name."),
    top: int = typer.Option(20, min=1, help="Rows to print."),
    scores: bool = typer.Option(False, help="Translate returning scores (translate_scored)."),
) -> None:
    """Print the profile's top operators (or nodes) by kernel time, with their call counts."""
    import onnxruntime as ort

    from src.runtime import batch_graph, generation, operator_graph

    lines = list(test_split(split_dir)["source"])[:sentences]
    translator = generation.load_translator(model, threads=threads, warn=lambda _: None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(typer.get_app_dir("nmt-profile")) / "profile")
    Path(options.profile_file_prefix).parent.mkdir(parents=True, exist_ok=True)
    # the session the runtime searches these batches with: a batch's is the file without its
    # BeamSearch operator (src/runtime/batch_graph.py), one sentence's the operator alone
    # (src/runtime/operator_graph.py); a last batch of one stays unprofiled
    cut = (batch_graph.without_operator if batch > 1
           else operator_graph.operator_only)(model.read_bytes())
    profiled = ort.InferenceSession(str(model) if cut is None else cut, options,
                                    providers=["CPUExecutionProvider"])
    if batch > 1 and cut is not None:
        translator.open_batch = lambda: profiled
    else:
        translator.session = profiled
    translate = translator.translate_scored if scores else translator.translate
    translate(lines[:batch], beam, batch_size=batch)  # warm-up, in the profile too
    _, wall = timed(translate, lines, beam, batch_size=batch)
    trace = Path(profiled.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    kernel, calls, runs = Counter(), Counter(), []
    for event in events:
        if event.get("cat") == "Session" and event["name"] == "model_run":
            runs.append(event["dur"])
        elif event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            key = op if by == "op" else f"{op} {event['name'][:-len('_kernel_time')]}"
            kernel[key] += event["dur"]
            calls[key] += 1
    run = sum(runs)
    leaves = sum(t for key, t in kernel.items() if key.split()[0] not in CONTROL)
    print(f"{model.name}, beam {beam}, batch {batch}, {threads} thread(s), {len(lines)} "
          f"sentences + a warm-up batch: session.run {run / 1e6:.3f} s, leaf kernels "
          f"{leaves / 1e6:.3f} s{', scores returned' if scores else ''}")
    batches = -(-len(lines) // batch)
    timed_run = sum(runs[-batches:]) / 1e6  # the timed pass's session.run calls
    outside_ms = 1e3 * (wall - timed_run) / len(lines)
    print(f"  the timed pass: {wall:.3f} s in translate, {timed_run:.3f} s of it in "
          f"session.run; outside it (tokenizing, batching, decoding) {outside_ms:.3f} ms per "
          f"sentence")
    for key in (k for k in kernel if k.split()[0] in CONTROL):
        print(f"  control {key:<60} {kernel[key] / 1e3:9.1f} ms  calls {calls[key]}")
    shown = [(k, t) for k, t in kernel.most_common() if k.split()[0] not in CONTROL][:top]
    for key, t in shown:
        print(f"  {key:<68} {t / 1e3:9.1f} ms {100 * t / max(run, 1):5.1f}%  calls {calls[key]}")


if __name__ == "__main__":
    run_cli(app)
