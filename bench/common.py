"""What every tool of bench/ needs, once: its command line, the machine, the commit, a sitting's
header, the test split, scratch projects, sittings files, whole JSON writes, the worker-process
protocol, the Markdown table and the block of a page a tool rewrites.

Imports nothing heavy at module level: a timing worker that must not hold torch imports this.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer
import yaml

from src.core import atomic, paths, tracking
from src.core.cli import run_cli  # noqa: F401  (every tool's entry point, `common.run_cli(app)`)
from src.core.errors import PipelineError

REPO = Path(__file__).resolve().parent.parent  # the checkout: where `python -m bench.…` runs
# The int8 and bf16 instructions ONNX Runtime's kernels may use (a timing depends on them).
ISA_FLAGS = ("avx2", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def cli_app(**options) -> typer.Typer:
    """A tool's command line: Typer without shell completion or locals in its tracebacks."""
    return typer.Typer(add_completion=False, pretty_exceptions_show_locals=False, **options)


def command() -> str:
    """The command line that runs this tool again, as typed: `python -m bench.<tool> …`."""
    return shlex.join(["python", "-m", f"bench.{Path(sys.argv[0]).stem}", *sys.argv[1:]])


def record(cpu: str = "machine", flags: bool = False, **fields) -> dict:
    """A sitting's header, as every tool writes it: the command, the checkout's commit, the
    CPU (under the key `cpu`; `flags`: its int8/bf16 flags, see cpu_description) and the date,
    then `fields`. The CPU's description imports torch: call it after the timed processes."""
    return {"command": command(), "commit": commit(), cpu: cpu_description(flags),
            "date": time.strftime("%Y-%m-%d")} | fields


def cpu_description(flags: bool = False) -> str:
    """'AMD EPYC (family 25 model 17), 2 cores, AVX-512 BF16, no AMX': /proc/cpuinfo's name
    and the bf16 feature as `train.precision: auto` reads it; with `flags`, the int8/bf16 flags
    instead ('…, 2 cores, avx2 avx512_vnni avx512_bf16')."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    info: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    if flags:
        features = " ".join(f for f in ISA_FLAGS if f in info.get("flags", "").split())
    else:
        from src.training.precision import cpu_bf16_feature  # torch: not in timing workers

        features = {"AMX": "AMX", "AVX-512 BF16": "AVX-512 BF16, no AMX"}.get(
            cpu_bf16_feature(), "no native bf16")
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family', '?')}"
            f" model {info.get('model', '?')}), {os.cpu_count()} cores, {features}")


def commit() -> str:
    """The checkout's short commit, as sittings record it."""
    return tracking.git_commit()[:7]


def test_split(split_dir: Path = paths.TOKENIZED):
    """The test part of the stored splits (columns source, target, source_ids, ...)."""
    from datasets import load_from_disk

    return load_from_disk(str(split_dir))["test"]


def chosen(text: str, known, option: str, what: str) -> list[str]:
    """The names of a comma list option, each one of `known`, else a usage error naming them."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise typer.BadParameter(f"no {what} named {', '.join(unknown)}; the {what}s are "
                                 f"{', '.join(known)}", param_hint=option)
    return names


def project_env(root: Path) -> dict[str, str]:
    """The environment of a pipeline stage run on the project at `root` (NMT_ROOT), with no
    tracking run: a benchmark, not an experiment."""
    return {**os.environ, "NMT_ROOT": str(root), "NMT_TRACKING": "off"}


def read_params(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def write_params(path: Path, params: dict) -> None:
    """`params` as the params.yaml of a scratch project, keys in their order."""
    Path(path).write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), the seconds it took)."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def same_share(got: list, expected: list) -> float:
    """The share of `got` equal to `expected` item by item (0 for none)."""
    return sum(a == b for a, b in zip(got, expected)) / max(len(got), 1)


def write_json(path: Path, doc, indent: int = 2) -> None:
    """`doc` as JSON, written whole (a temporary sibling, then renamed)."""
    atomic.write_text(path, json.dumps(doc, indent=indent, ensure_ascii=False) + "\n")


def read_sittings(path: Path) -> list[dict]:
    """The sittings of a file, oldest first: {"sittings": [...]} or one sitting on its own."""
    return sittings_of(json.loads(Path(path).read_text(encoding="utf-8")))


def sittings_of(data: dict) -> list[dict]:
    return list(data["sittings"]) if "sittings" in data else [data]


def append_sitting(path: Path, sitting: dict) -> None:
    """One more sitting at the end of a sittings file (made if missing), written whole, so a
    failure leaves the file as it was."""
    doc = json.loads(Path(path).read_text(encoding="utf-8")) if Path(path).exists() else {}
    write_json(path, doc | {"sittings": (sittings_of(doc) if doc else []) + [sitting]})


PEER = "Hugging Face peer"  # the system name of the training peer's rows


def best_speed(rows: list[dict], system: str, precision: str) -> float | None:
    """A training sitting's fastest tokens/s among the rows of one system and precision (the
    peer's rows name it PEER), or None where it has none."""
    return max((r["tokens_per_s"] for r in rows
                if r["system"] == system and r["precision"] == precision), default=None)


def latest_by_cpu(sittings: list[dict]) -> list[dict]:
    """The last sitting of each CPU, newest first: what today's code does on each kind of
    machine (every sitting stays in its file)."""
    latest: dict[str, dict] = {}
    for one in reversed(sittings):
        latest.setdefault(one["cpu"], one)
    return list(latest.values())


class WorkerFailed(PipelineError):
    """A worker process exited non-zero; the message is `exit N: <its last stderr line>`."""


def start_worker(module: str, spec: dict, work: Path) -> subprocess.Popen:
    """`python -m <module> --worker <spec.json>` in a fresh process: the worker protocol. A
    timing process of its own keeps one engine's threads, imports and allocator away from
    another's; the worker prints its result as the last line of stdout (`serve_worker`)."""
    spec_file = Path(tempfile.mkstemp(suffix=".json", dir=work)[1])
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    return subprocess.Popen([sys.executable, "-m", module, "--worker", str(spec_file)],
                            cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def worker_result(proc: subprocess.Popen, timeout: float | None = None) -> dict:
    """The JSON result of a worker `start_worker` started (its stderr passed on to ours), or
    WorkerFailed; subprocess.TimeoutExpired while it runs on past `timeout`."""
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        why = (err.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise WorkerFailed(f"exit {proc.returncode}: {why}")
    sys.stderr.write(err)
    return json.loads(out.strip().splitlines()[-1])


def run_worker(module: str, spec: dict, work: Path) -> dict:
    """`start_worker` and wait for its result."""
    return worker_result(start_worker(module, spec, work))


def serve_worker(spec_file: Path, work) -> None:
    """The worker's side: `work(spec)` on the spec file's dict, its result on the last line."""
    print(json.dumps(work(json.loads(Path(spec_file).read_text(encoding="utf-8")))))


def markdown_table(header: list, rows: list[list], align: list[str] | None = None) -> list[str]:
    """A Markdown table's lines; `align` is each column's rule (`---`, `---:`), else `|---|`."""
    rule = ("|" + "---|" * len(header) if align is None
            else "| " + " | ".join(align) + " |")
    return ["| " + " | ".join(map(str, header)) + " |", rule] + [
        "| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]


def replace_block(doc: Path, start: str, end: str, body: str) -> None:
    """Rewrite the block of `doc` between the markers `start` and `end` (one marker may be
    both) as `body`, the rest of the page as it was."""
    text = doc.read_text(encoding="utf-8")
    head, found, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise SystemExit(f"error: {doc} has no {start} ... {end} block")
    doc.write_text(f"{head}{start}\n{body}\n{end}{tail}", encoding="utf-8")


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (none if it is missing)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def span(values, show=str) -> str:
    """'3' or '2–5': the lowest and highest of `values`, once where they are equal."""
    low, high = min(values), max(values)
    return show(low) if low == high else f"{show(low)}–{show(high)}"


def ints(text: str) -> list[int]:
    """'1,32' -> [1, 32]: the comma lists of the tools' options."""
    return [int(x) for x in text.split(",")]
