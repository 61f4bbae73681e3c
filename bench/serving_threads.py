"""The served model under load, per ONNX Runtime thread count: `run` writes a sitting to a JSON
file, `table` prints the table docs/serving.md shows from it.
"""

from __future__ import annotations

import json
import math
import tempfile
from itertools import product
from pathlib import Path

import typer

from bench import common
from bench.common import ints, markdown_table, span, write_json
from bench.serving_load import measured, sentence_pool
from src.core import tracking
from src.core.errors import PipelineError
from src.core.local_servers import ServerDidNotStart, model_server

app = common.cli_app(help=__doc__.split("\n\n")[0])


def thread_orders(threads: list[int], rounds: int) -> list[list[int]]:
    """Round r serves the counts in the given order, reversed every other round."""
    return [threads if r % 2 == 0 else threads[::-1] for r in range(rounds)]


def requests_for(batch: int, sentences_per_row: int) -> int:
    return max(1, math.ceil(sentences_per_row / batch))


def render(sitting: dict) -> str:
    """The markdown table of one sitting's rows (see the module docstring)."""
    rows = sitting["rows"]
    counts = sorted({r["threads"] for r in rows})
    cells = sorted({(r["batch"], r["clients"]) for r in rows})
    rounds = len({r["round"] for r in rows})
    one_decimal = "{:.1f}".format
    label = {n: f"{n} thread{'s' if n > 1 else ''}" for n in counts}

    def of(threads: int, cell: tuple[int, int], key: str) -> list[float]:
        return [r[key] for r in rows if r["threads"] == threads and (r["batch"], r["clients"])
                == cell]

    body = []
    for cell in cells:
        speeds = {n: of(n, cell, "sentences_per_s") for n in counts}
        shown = []
        for n in counts:
            text = span(speeds[n], one_decimal)
            others = [max(v) for m, v in speeds.items() if m != n and v]
            if speeds[n] and others and min(speeds[n]) > max(others):
                text = f"**{text}**"
            shown.append(text)
        latency = [span(of(n, cell, "p50_ms"), one_decimal) for n in counts]
        body.append([*cell, *shown, *latency])
    header = ["sentences per request", "clients", *(f"{label[n]}: sent/s" for n in counts),
              *(f"{label[n]}: p50 ms" for n in counts)]
    return "\n".join([f"{sitting['cpu']}; commit {sitting['commit']}; ONNX Runtime "
                      f"{sitting['onnxruntime']}; {sitting['model']}; {rounds} round(s), "
                      f"lowest–highest; errors: {sum(r['errors'] for r in rows)}.", "",
                      *markdown_table(header, body, ["---:"] * len(header))])


def registered_version(model: str) -> str:
    """'models:/nmt-en-zh@candidate (version 2)': which model the rows measured, so a later
    export under the same alias is not taken for it; one line if the store does not have it."""
    from src.core import registry

    try:
        ref = registry.parse_model_uri(model)
    except ValueError:
        return model  # runs:/…, a path: the URI says it all
    return f"{model} (version {registry.find_version(registry.open_client(), ref).version})"


@app.command()
def run(
    json_out: Path = typer.Option(..., "--json", help="Write the sitting here."),
    model: str = typer.Option("models:/nmt-en-zh@candidate", help="The model to serve."),
    sentences: Path = typer.Option(None, help="Source sentences, one per line."),
    threads: str = typer.Option("1,2", help="NMT_THREADS of each server, comma-separated."),
    rounds: int = typer.Option(3, min=1, help="Servers per thread count, orders alternating."),
    batches: str = typer.Option("1,32", help="Sentences per request, comma-separated."),
    clients: str = typer.Option("1,4,16", help="Concurrent clients, comma-separated."),
    sentences_per_row: int = typer.Option(640, min=1, help="Sentences each row sends, in "
                                          "requests of its batch size."),
    warmup: int = typer.Option(16, min=0, help="Untimed requests before each row."),
    timeout: float = typer.Option(120, min=1, help="Seconds before a request counts as lost."),
) -> None:
    """Serve the model once per thread count per round and load it; write the rows."""
    import onnxruntime  # the CPU or the GPU build, whichever is installed

    pool = sentence_pool(sentences)
    # the server runs in a directory of its own: it finds the registry by the URI, not by cwd
    env = {"MLFLOW_TRACKING_URI": tracking.tracking_uri()}
    sitting = common.record(cpu="cpu", flags=True, onnxruntime=onnxruntime.__version__,
                            model=registered_version(model), rows=[])
    try:
        for round_index, order in enumerate(thread_orders(ints(threads), rounds), start=1):
            for n in order:
                with (tempfile.TemporaryDirectory() as work,
                      model_server(model, Path(work), env | {"NMT_THREADS": str(n)}) as (url, _)):
                    for batch, n_clients in product(ints(batches), ints(clients)):
                        sitting["rows"].append({"round": round_index, "threads": n} | measured(
                            url, pool, batch, n_clients, requests_for(batch, sentences_per_row),
                            warmup, timeout))
                        print(json.dumps(sitting["rows"][-1]), flush=True)
                write_json(json_out, sitting, indent=1)
    except ServerDidNotStart as exc:
        raise PipelineError(f"{model} was not served ({env['MLFLOW_TRACKING_URI']}): {exc}") \
            from None
    print(render(sitting))
    if any(r["errors"] for r in sitting["rows"]):
        raise typer.Exit(1)


@app.command()
def table(sitting: Path = typer.Argument(..., help="A file `run --json` wrote.")) -> None:
    """Print the sitting's table."""
    print(render(json.loads(sitting.read_text(encoding="utf-8"))))


if __name__ == "__main__":
    common.run_cli(app)
