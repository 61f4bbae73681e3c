"""What a GPU adds, checked on one: placement, parity, BLEU, the batch table, serving, engines
and training, one row each in a JSON file (default docs/benchmarks/gpu_check.json). Each check,
option and row is explained in docs/gpu.md ("The GPU check").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import product
from pathlib import Path
from types import SimpleNamespace

import typer

from bench import common, serving_load
from bench.common import REPO, test_split
from src.core import errors, failpoints, local_servers, paths
from src.core.metrics import bleu
from src.core.params import ExportParams, ModelParams, TrainParams, load_params
from src.data.subword import load_tokenizers
from src.runtime import generation, placement, sessions  # no onnxruntime until a session opens

FILES = ("model.onnx", "model.fp16.onnx", "model.int8.onnx", "model.text.onnx",
         "model.int8.text.onnx")


def no_gpu_reason(pytorch_only: bool = False) -> str:
    """Why this machine cannot run the check ("" when it can)."""
    import torch

    if not pytorch_only:
        import onnxruntime

        why = placement.cuda_unavailable_reason(onnxruntime.get_available_providers())
        if why:
            return why
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (install a CUDA build of torch)"
    return ""


def build(root: Path, minutes: float) -> Path:
    """A scratch project at `root` from this checkout's params.yaml, trained and exported."""
    params = common.read_params(REPO / "params.yaml")
    params["train"]["max_minutes"] = minutes
    root.mkdir(parents=True, exist_ok=True)
    common.write_params(root / "params.yaml", params)
    for module in ("download", "split", "tokenize_corpus", "train", "export"):
        print(f"gpu_check: {module}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", f"src.{module}"], cwd=REPO,
                       env=common.project_env(root), check=True)
    return root


def present(models: Path, provider: str, names=FILES) -> list[str]:
    """The files of `names` that models/ holds and `provider` runs (fp16: CUDA only)."""
    return [n for n in names if (models / n).is_file()
            and not (n == "model.fp16.onnx" and provider == "cpu")]


def placement_rows(models: Path, provider: str) -> list[dict]:
    rows = []
    for name in present(models, provider):
        forced = [provider] if provider == "cpu" else ["auto"] + (
            ["cuda"] if "int8" in name or "text" in name else [])
        for choice in forced:
            warnings: list[str] = []
            session = sessions.open_session(models / name, choice, warn=warnings.append)
            rows.append({"check": "placement", "file": name, "provider": choice,
                         "nodes": placement.describe(session), "warnings": warnings})
    return rows


def parity_rows(models: Path, data: Path, provider: str, cfg, n: int) -> list[dict]:
    """Generation files against PyTorch token for token; text files against PyTorch's output
    decoded by the tokenizer."""
    from src.graph import verify
    from src.nmt import checkpoint
    from src.nmt.search import translate_ids

    model, _ = checkpoint.load_model(models / "model.pt")
    test = test_split(data)
    sources, texts = list(test["source_ids"])[:n], list(test["source"])[:n]
    rows = []
    for name in present(models, provider, ("model.onnx", "model.fp16.onnx")):
        result = verify.parity(sessions.open_session(models / name, provider), model, sources, cfg)
        result.pop("mismatches")
        ok = result["greedy_parity"] == 1.0 and result["beam_parity"] >= cfg.min_beam_parity
        rows.append({"check": "parity", "file": name, "provider": provider, **result,
                     "passed": ok})
    tok = load_tokenizers(models / "tokenizer")
    expected = tok.decode_target(translate_ids(model, sources, cfg.beam_size, cfg.length_penalty,
                                               cfg.max_length_ratio, cfg.batch_size))
    for name in present(models, provider, ("model.text.onnx",)):
        translator = generation.load_translator(models / name, None, provider)
        got = translator.translate(texts, batch_size=cfg.batch_size)
        same = common.same_share(got, expected)
        row = {"check": "parity", "file": name, "provider": provider,
               "parity_sentences": len(texts), "beam_parity": round(same, 4),
               "passed": same >= cfg.min_beam_parity}
        if provider != "cpu":  # the same strings as the file gives on the CPU?
            on_cpu = generation.load_translator(models / name, None, "cpu").translate(
                texts, batch_size=cfg.batch_size)
            row["same_as_cpu"] = round(common.same_share(got, on_cpu), 4)
        rows.append(row)
    return rows


def bleu_rows(models: Path, data: Path, provider: str, cfg) -> list[dict]:
    test = test_split(data)
    target_lang = load_tokenizers(models / "tokenizer").target_lang
    rows = []
    for name in present(models, provider):
        path = models / name
        choice = provider if "int8" not in name else "cpu"  # int8 runs on the CPU by design
        tokenizer = None if "text" in name else models / "tokenizer"
        translator = generation.load_translator(path, tokenizer, choice, warn=lambda _: None)
        hyps, seconds = common.timed(translator.translate, list(test["source"]),
                                     batch_size=cfg.batch_size)
        rows.append({"check": "bleu", "file": name, "provider": choice,
                     "bleu": bleu(hyps, list(test["target"]), target_lang),
                     "sentences": len(hyps), "sentences_per_s": round(len(hyps) / seconds, 1)})
    return rows


def timed_search(model, sources: list[list[int]], search: tuple, device: str
                 ) -> tuple[list, float]:
    """PyTorch's search (`translate_ids(model, sources, *search)`) after one warm-up batch
    (kernels, allocator), timed to the last kernel: (hypotheses, seconds)."""
    import torch

    from src.nmt.search import translate_ids

    def search_all(rows: list[list[int]]) -> list:
        hyps = translate_ids(model, rows, *search)
        if device == "cuda":
            torch.cuda.synchronize()
        return hyps

    search_all(sources[: search[-1]])
    return common.timed(search_all, sources)


def search_rows(models: Path, data: Path, device: str, cfg, n: int) -> list[dict]:
    """PyTorch's search on `device` against the same search on the CPU (the first `n` test
    sentences, token for token), then BLEU and sentences/s on the whole test split."""
    from src.nmt import checkpoint
    from src.nmt.search import translate_ids

    model, _ = checkpoint.load_model(models / "model.pt")
    test = test_split(data)
    sources, references = list(test["source_ids"]), list(test["target"])
    tok = load_tokenizers(models / "tokenizer")
    rows = []
    for beam in (1, cfg.beam_size):
        search = (beam, cfg.length_penalty, cfg.max_length_ratio, cfg.batch_size)
        on_cpu = translate_ids(model.to("cpu"), sources[:n], *search)
        model.to(device)
        parity = round(common.same_share(translate_ids(model, sources[:n], *search), on_cpu), 4)
        hyps, seconds = timed_search(model, sources, search, device)
        rows.append({"check": "search", "device": device, "beam": beam,
                     "batch_size": cfg.batch_size, "cpu_parity": parity,
                     "parity_sentences": min(n, len(sources)),
                     "bleu": bleu(tok.decode_target(hyps), references, tok.target_lang),
                     "sentences": len(hyps), "sentences_per_s": round(len(hyps) / seconds, 1),
                     "passed": parity >= cfg.min_beam_parity})
    return rows


TABLE_ENGINES = ("model.onnx", "model.fp16.onnx", "pytorch")


def cell(spec: dict) -> dict:
    """One cell of the batch table in this process (`table_rows` starts it): sentences/s on the
    first `n` test sentences in length-sorted batches of `batch`, after one warm-up batch."""
    root, device, engine, batch, beam = (Path(spec["root"]), spec["device"], spec["engine"],
                                         spec["batch"], spec["beam"])
    errors.require_file(root / "models/model.pt", "train")  # before seconds of importing torch
    from src.graph import verify
    from src.nmt import checkpoint

    model, _ = checkpoint.load_model(root / "models/model.pt")
    test = test_split(root / "data/tokenized")
    sources, texts = list(test["source_ids"])[: spec["n"]], list(test["source"])[: spec["n"]]
    cfg = load_params(ExportParams, path=root / "params.yaml").model_copy(
        update={"batch_size": batch, "beam_size": beam})
    if engine == "pytorch":
        model.to(device)
        _, seconds = timed_search(model, sources,
                                  (beam, cfg.length_penalty, cfg.max_length_ratio, batch), device)
    else:
        session = sessions.open_session(root / "models" / engine, device)
        verify.translate(session, sources[:batch], texts[:batch], model, cfg)  # warm-up
        _, seconds = verify.translate(session, sources, texts, model, cfg)
    return {"check": "batches", "engine": engine, "device": device, "batch_size": batch,
            "beam": beam, "sentences": len(sources),
            "sentences_per_s": round(len(sources) / seconds, 1)}


def gpu_memory_mib(pid: int) -> tuple[int | None, int | None]:
    """(the GPU memory nvidia-smi says process `pid` holds, the memory in use on the first GPU),
    MiB; None for what it cannot say (in a container it may list host pids)."""
    def query(what: str) -> list[list[str]]:
        try:
            out = subprocess.run(["nvidia-smi", f"--query-{what}",
                                  "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [[f.strip() for f in line.split(",")] for line in out.splitlines()]

    held = next((int(used) for p, used in (r for r in query("compute-apps=pid,used_memory")
                                           if len(r) == 2)
                 if p == str(pid) and used.isdigit()), None)
    total = next((int(r[0]) for r in query("gpu=memory.used") if r and r[0].isdigit()), None)
    return held, total


def table_rows(root: Path, device: str, n: int, batches: list[int]) -> list[dict]:
    """The batch table: each cell in a fresh process (so every engine starts from an empty
    allocator), its GPU memory polled while it runs; the fp16 file on CUDA only."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-cells-") as work:
        for engine in TABLE_ENGINES:
            if engine != "pytorch" and not present(root / "models", device, (engine,)):
                continue
            for batch, beam in product(batches, (1, 4)):
                spec = {"root": str(root), "device": device, "engine": engine,
                        "batch": batch, "beam": beam, "n": n}
                try:
                    rows.append(watched_cell(spec, Path(work)))
                except common.WorkerFailed as exc:  # the other cells still run; the row says why
                    rows.append({"check": "batches", "engine": engine, "batch_size": batch,
                                 "beam": beam, "error": str(exc)})
                print(f"gpu_check: {json.dumps(rows[-1])}", file=sys.stderr)
    return rows


def watched_cell(spec: dict, work: Path) -> dict:
    """A cell's row from its own process, with its peak GPU memory: the process's own where
    nvidia-smi lists it, else the GPU's above what it held before the cell started."""
    cuda = spec["device"] == "cuda"
    baseline = gpu_memory_mib(0)[1] if cuda else None
    proc = common.start_worker("bench.gpu_check", spec, work)
    peak = peak_total = None
    while True:
        try:
            row = common.worker_result(proc, timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            held, total = gpu_memory_mib(proc.pid) if cuda else (None, None)
            if held is not None:
                peak = max(peak or 0, held)
            if total is not None and baseline is not None:
                peak_total = max(peak_total or 0, total - baseline)
    return {**row, "peak_gpu_memory_mib": peak if peak is not None else peak_total,
            "memory_of": "process" if peak is not None else
            "GPU above its use before the cell" if peak_total is not None else None}


def serve_rows(root: Path, device: str, work: Path, requests: int) -> list[dict]:
    """The MLflow model registered in a scratch store, under `mlflow models serve` and
    bench.serving_load on CUDA and on the CPU (`NMT_PROVIDER`); on the CPU alone in a rehearsal."""
    import mlflow

    from src.runtime import serving

    models, store = root / "models", work / "serve"
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    experiment = mlflow.create_experiment("gpu-check", artifact_location=str(store / "runs"))
    with mlflow.start_run(experiment_id=experiment):
        serving.log_model(models / "model.onnx", models / "model.int8.onnx",
                          models / "tokenizer", "nmt-gpu-check", models / "model.fp16.onnx")
    pool = list(test_split(root / "data/tokenized")["source"])
    rows = []
    for provider in ("cuda", "cpu") if device == "cuda" else ("cpu",):
        try:
            with local_servers.model_server(
                    "models:/nmt-gpu-check@candidate", store / provider,
                    {"MLFLOW_TRACKING_URI": uri, "NMT_PROVIDER": provider},
                    start_timeout_s=180) as (url, log):
                loaded = [serving_load.measured(url, pool, batch, clients, requests, 4)
                          for batch, clients in product((1, 32), (1, 4))]
                ran_on = next((line.split("nmt: ", 1)[1].strip() for line in
                               log.read_text(errors="replace").splitlines() if "nmt: " in line),
                              None)
        except local_servers.ServerDidNotStart as exc:
            raise RuntimeError(f"the served model ({provider}) did not come up: {exc}") \
                from None
        rows += [{"check": "serve", "provider": provider, "ran_on": ran_on, "via": "http", **row}
                 for row in loaded]
    return rows


def speed_rows(models: Path, data: Path, work: Path) -> list[dict]:
    out = work / "engines.json"
    subprocess.run([sys.executable, "-m", "bench.engines_vs_ctranslate2", "--device",
                    "cuda", "--models", str(models), "--split-dir", str(data),
                    "--precisions", "fp32,fp16", "--threads", "1", "--json", str(out)],
                   check=True, cwd=REPO)
    return [{"check": "speed", **row} for row in json.loads(out.read_text())["rows"]]


def train_rows(root: Path, steps: int, work: Path) -> list[dict]:
    """The train stage's own code for `steps` steps in auto precision and in fp32."""
    import torch

    from src.training.distributed import World
    from src.training.stage import train

    model_params = load_params(ModelParams, path=root / "params.yaml")
    base = load_params(TrainParams, path=root / "params.yaml")
    os.environ["NMT_TRACKING"] = "off"  # a check, not an experiment: no run in the project's store
    rows = []  # on a GPU auto is tf32, so bf16 autocast gets a row of its own
    for precision in ("auto", "bf16", "fp32") if torch.cuda.is_available() else ("auto", "fp32"):
        out = work / f"train-{precision}"
        cfg = base.model_copy(update={"precision": precision, "max_steps": steps,
                                      "max_minutes": 0, "patience": 0})
        _, seconds = common.timed(train, World(), model_params, cfg, root / "data/tokenized",
                                  root / "models/tokenizer", out / "checkpoints", out / "model.pt",
                                  (out / "metrics.json", out / "stats.json"), 10**9)
        stats = json.loads((out / "stats.json").read_text())
        rows.append({"check": "train", "precision": stats.get("precision"), "steps": steps,
                     "seconds": round(seconds, 1),
                     **{k: stats[k] for k in ("final_valid_loss", "valid_bleu",
                                              "tokens_per_s") if k in stats}})
    return rows


# Every check, in the order a run makes them: (whether a run with these options makes it, its
# rows). `o` holds the options, then the run's models, data, provider, cfg and work folder.
CHECKS = {
    "search": (lambda o: o.pytorch_only,
               lambda o: search_rows(o.models, o.data, o.provider, o.cfg, o.sentences)),
    "placement": (lambda o: not o.pytorch_only, lambda o: placement_rows(o.models, o.provider)),
    "parity": (lambda o: not o.pytorch_only,
               lambda o: parity_rows(o.models, o.data, o.provider, o.cfg, o.sentences)),
    "bleu": (lambda o: not o.pytorch_only,
             lambda o: bleu_rows(o.models, o.data, o.provider, o.cfg)),
    "batches": (lambda o: not o.pytorch_only and o.table_sentences,
                lambda o: table_rows(o.root, o.provider, o.table_sentences,
                                     common.ints(o.table_batches))),
    "serve": (lambda o: not o.pytorch_only and o.serve_requests,
              lambda o: serve_rows(o.root, o.provider, o.work, o.serve_requests)),
    "speed": (lambda o: not (o.rehearse_on_cpu or o.pytorch_only or o.onnx_only),
              lambda o: speed_rows(o.models, o.data, o.work)),
    "train": (lambda o: not o.onnx_only, lambda o: train_rows(o.root, o.train_steps, o.work)),
}


app = common.cli_app()


@app.command(help=__doc__)
def main(
    root: Path = typer.Option(paths.ROOT, help="Project whose models/ and data/ are checked."),
    build_minutes: float = typer.Option(0, help="First train and export a model this long."),
    sentences: int = typer.Option(200, help="Parity sentences."),
    train_steps: int = typer.Option(300),
    table_sentences: int = typer.Option(512, help="Sentences per batch-table cell (0: none)."),
    table_batches: str = typer.Option("1,32,256", help="The batch table's batch sizes."),
    serve_requests: int = typer.Option(40, help="Requests per served-model row (0: none)."),
    checks: str = typer.Option(None, help=f"Only these, in order: of {', '.join(CHECKS)}."),
    output: Path = typer.Option(REPO / "docs/benchmarks/gpu_check.json"),
    rehearse_on_cpu: bool = typer.Option(False, "--rehearse-on-cpu", help="Steps on the CPU."),
    pytorch_only: bool = typer.Option(False, "--pytorch-only", help="No ONNX rows."),
    onnx_only: bool = typer.Option(False, "--onnx-only", help="No engine or train rows."),
    worker_spec: Path = typer.Option(None, "--worker", hidden=True),  # one batch-table cell
) -> int:
    if worker_spec:
        return common.serve_worker(worker_spec, cell)
    if onnx_only and pytorch_only:
        raise typer.BadParameter("--onnx-only and --pytorch-only leave nothing to check "
                                 "together: pick one")
    asked = common.chosen(checks or "", CHECKS, "--checks", "check")
    o = SimpleNamespace(**locals())
    available = [name for name, (makes, _) in CHECKS.items() if makes(o)]
    left_out = [name for name in asked if name not in available]
    if left_out:
        raise typer.BadParameter(f"{', '.join(left_out)} cannot run with these options (they "
                                 f"leave {', '.join(available)})", param_hint="--checks")
    planned = list(dict.fromkeys(asked)) if asked else available
    why = "" if rehearse_on_cpu else no_gpu_reason(pytorch_only)
    if why:
        print(f"gpu_check: no GPU to check here ({why}); run it on a machine with an "
              f"NVIDIA GPU, onnxruntime-gpu and a CUDA build of torch", file=sys.stderr)
        return 1
    import torch

    provider = "cpu" if rehearse_on_cpu else "cuda"
    machine = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
               "cpu": common.cpu_description(flags=True), "torch": torch.__version__,
               "provider": provider}
    if not pytorch_only:
        import onnxruntime

        machine["onnxruntime"] = onnxruntime.__version__
    report = {"command": common.command(), "machine": machine, "complete": False,
              "check_seconds": {}, "rows": []}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        root = build(work / "project", build_minutes) if build_minutes else root
        models, data = root / "models", root / "data/tokenized"
        needed = (models / "model.pt", data) + (() if pytorch_only else (models / "model.onnx",))
        missing = [p for p in needed if not p.exists()]
        if missing:
            print(f"gpu_check: {missing[0]} not found: run `dvc repro` first, or pass "
                  f"--build-minutes 4", file=sys.stderr)
            return 1
        cfg = load_params(ExportParams, path=root / "params.yaml")
        vars(o).update(root=root, models=models, data=data, provider=provider, cfg=cfg, work=work)
        for name in planned:
            print(f"gpu_check: {name} ...", file=sys.stderr)
            start = time.perf_counter()
            try:
                report["rows"] += CHECKS[name][1](o)
            except (Exception, SystemExit) as exc:  # the next check still runs; the row says why
                why = str(exc) or type(exc).__name__
                report["rows"].append({"check": name, "error": " ".join(why.split())})
                print(f"gpu_check: {name} failed: {why}", file=sys.stderr)
            report["check_seconds"][name] = round(time.perf_counter() - start, 1)
            # on disk after every check: a run stopped halfway keeps what it measured
            common.write_json(output, report)
            failpoints.hit("gpu_check_after_check")
    report["complete"] = True
    common.write_json(output, report)
    rows = report["rows"]
    failed = [r for r in rows if r.get("passed") is False]
    broken = [r["check"] for r in rows if "error" in r]
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    print(f"gpu_check: {len(rows)} rows in {output}; "
          + (f"{len(failed)} parity checks FAILED" if failed else "every parity check passed")
          + (f"; these checks failed: {', '.join(broken)}" if broken else ""))
    return 1 if failed or broken else 0


if __name__ == "__main__":
    common.run_cli(app)
