"""export: models/model.pt + models/tokenizer -> models/model.onnx, one file with the whole search.

Reads params `export.*`; the languages come from models/tokenizer/tokenizer.json. Builds the
single-file generation graph of src/graph/onnx_graph.py (encoder, KV-cached decoder and
beam/greedy search: ONNX Runtime's BeamSearch node for one sentence, a Loop that drops
finished sentences for a batch (src/graph/search_loop.py); special ids, languages, limits and
tokenizer fingerprints in metadata_props) and its text-in, text-out twin, and verifies both
before they are moved into place (src/graph/verify.py: `onnx.checker`, ONNX Runtime against
PyTorch's search on the first `export.parity_sentences` test sentences, BLEU on the whole test
split).
With `export.quantize`, models/model.int8.onnx (int8 weights, quantized per subgraph) and its
twin too; with `export.fp16`, models/model.fp16.onnx (float16 subgraphs, for GPUs: ONNX
Runtime runs it on CUDA only), whose structure is checked everywhere and parity where CUDA runs.

Writes models/model.onnx and models/model.text.onnx (DVC outs), models/model.int8.onnx and
models/model.int8.text.onnx (not DVC outs: DVC requires declared outs to exist, and these are
optional), models/export_metrics.json (BLEU, size and speed of each file: the DVC metrics) and
models/export_stats.json (also parity, timings and the onnxruntime version). MLflow gets the
model of src/runtime/serving.py (both files and the tokenizer as artifacts), registered as a
new version of `nmt-<src>-<tgt>` with the alias `candidate`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import typer

from src.core import paths, registry, tracking
from src.core.cli import run_cli
from src.core.cpus import usable_cpus
from src.core.errors import PipelineError, require_file
from src.core.params import ExportParams, load_params
from src.core.reports import EXPORT_HEADLINE, write_report
from src.data.subword import BOS, EOS, PAD, UNK, Tokenizers, check_encoded_with, load_tokenizers
from src.runtime import contract, sessions
from src.training.init_from import parent_record, parent_tags

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)

def model_metadata(model, tok: Tokenizers, cfg: ExportParams, tokenizer_dir: Path) -> dict:
    """Everything `src.infer` needs beside the graph, stored as metadata_props."""
    return {
        "format": contract.GRAPH_FORMAT,
        "pad_id": PAD, "unk_id": UNK, "bos_id": BOS, "eos_id": EOS,
        "source_lang": tok.source_lang,
        "target_lang": tok.target_lang,
        "source_vocab": model.config.src_vocab, "target_vocab": model.config.tgt_vocab,
        "max_source_tokens": model.max_positions,  # including the EOS the source ends with
        "max_output_tokens": model.max_positions - 1,
        "max_length_ratio": cfg.max_length_ratio,
        "beam_size": cfg.beam_size, "length_penalty": cfg.length_penalty,
        **sessions.tokenizer_metadata(tokenizer_dir),
    }


def check_vocab(model, tok: Tokenizers) -> None:
    sizes = (model.config.src_vocab, model.config.tgt_vocab)
    if sizes != (tok.source_vocab, tok.target_vocab):
        raise PipelineError(f"tokenizer vocabularies {tok.source_vocab}/{tok.target_vocab} do "
                            f"not match the model's {sizes[0]}/{sizes[1]}: re-run tokenize+train")


def log_run(run, result: dict, files: dict[str, Path | None], tokenizer_dir: Path,
            tok: Tokenizers, model_path: Path, evaluated: dict,
            parent: dict | None) -> str | None:
    """Metrics, and the MLflow model (src/runtime/serving.py) as a new registered version;
    `files`: the path of each precision written ("fp32", "int8", "fp16"), None if not.

    The run also keeps what a later run needs to start from this version (train.init_from):
    model.pt and the tokenizer under `weights/`; evaluate's scores as `eval.*` metrics, which
    `src.promote` compares; and the version names the version it was trained from."""
    numeric = {k: v for k, v in result.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    numeric |= {f"eval.{k}": v for k, v in tracking.flatten(evaluated).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
    run.log_metrics(numeric)
    run.log_dict(result, "export_metrics.json")
    run.log_artifact(model_path, registry.WEIGHTS_ARTIFACT)
    run.log_artifacts(tokenizer_dir, f"{registry.WEIGHTS_ARTIFACT}/tokenizer")
    name = f"nmt-{tok.source_lang}-{tok.target_lang}"

    def log_model() -> str:
        # Imported only where a run logs: serving imports mlflow.pyfunc (seconds), which an
        # export with tracking off never needs.
        from src.runtime import serving

        return serving.log_model(files["fp32"], files["int8"], tokenizer_dir, name,
                                 files["fp16"])

    version = run.log_model(log_model)
    if version is not None and parent:
        tags = parent_tags(parent)
        of = (f"{parent['name']} version {parent['version']}" if "version" in parent
              else parent["init_from"])
        run.describe_version(name, version, tags, f"Trained from {of} ({parent['init_from']}; "
                             f"model.pt sha256 {parent['sha256'][:12]}).")
    return version


def evaluated_scores(path: Path) -> dict:
    """evaluate's metrics.json (the test split's and each named set's scores), {} if absent."""
    import json

    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@app.command()
def main(model_path: Path = typer.Option(paths.MODELS / "model.pt", help="Model from `train`."),
         tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir."),
         split_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded splits (test; valid)."),
         onnx_path: Path = typer.Option(paths.ONNX_MODEL, help="Generation model to write."),
         int8_path: Path = typer.Option(paths.ONNX_INT8_MODEL, help="int8 twin to write."),
         fp16_path: Path = typer.Option(paths.ONNX_FP16_MODEL,
                                        help="float16 twin to write (GPUs: runs on CUDA only)."),
         score_path: Path = typer.Option(paths.ONNX_SCORE_MODEL,
                                         help="Scoring model to write (src.score)."),
         metrics: Path = typer.Option(paths.EXPORT_METRICS, help="Headline JSON (DVC metrics)."),
         stats: Path = typer.Option(paths.EXPORT_STATS, help="Everything about the export, JSON."),
         eval_metrics: Path = typer.Option(paths.EVAL_METRICS, help="evaluate's scores, kept "
                                           "with the registered version for src.promote."),
         parent_dir: Path = typer.Option(paths.PARENT, help="The parent stage's folder: the "
                                         "version names the version it was trained from."),
         ) -> None:
    """Export model.pt to one model.onnx with the search inside (params `export.*`), verified
    against PyTorch."""
    cfg = load_params(ExportParams)
    parent = parent_record(parent_dir)
    for path, stage in ((model_path, "train"), (tokenizer_dir, "tokenize"),
                        (split_dir, "tokenize")):
        require_file(path, stage)
    # Imported only now: torch and the exporter take seconds to import, and `--help` or a
    # missing input should answer at once.
    import torch
    from datasets import disable_progress_bars, load_from_disk

    from src.graph import likelihood_graph, onnx_graph
    from src.graph.verify import write_verified
    from src.nmt import checkpoint

    disable_progress_bars()
    torch.set_num_threads(usable_cpus())
    model, _ = checkpoint.load_model(model_path)
    check_encoded_with(split_dir, tokenizer_dir)
    tok = load_tokenizers(tokenizer_dir)
    check_vocab(model, tok)
    splits = load_from_disk(str(split_dir))
    part = splits["test"]
    valid = splits["valid"] if "valid" in splits else None
    metadata = model_metadata(model, tok, cfg, tokenizer_dir)
    params = {"export": cfg.model_dump()}
    deps = [model_path, tokenizer_dir, split_dir]
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    with tracking.stage_run("export", params, deps=deps) as run, \
            tempfile.TemporaryDirectory(prefix=".export.", dir=onnx_path.parent) as work:
        run.log_datasets(split_dir, {"test": "evaluation"})
        start = time.perf_counter()
        built = onnx_graph.build(model, metadata, cfg.opset,
                                 Path(work) if cfg.quantize else None, cfg.fp16)
        scorer = likelihood_graph.export_scorer(model, cfg.opset, metadata)
        result = {"export_seconds": round(time.perf_counter() - start, 1)}
        result.update(write_verified(built.fp32, built.int8, (onnx_path, int8_path), model, tok,
                                     part, cfg, tokenizer_dir, built.fp16, fp16_path, valid,
                                     (scorer, score_path)))
        result.update({"test_sentences": len(part), "onnxruntime": _ort_version()})
        write_report(result, stats, metrics, EXPORT_HEADLINE)
        files = {"fp32": onnx_path, "int8": int8_path if built.int8 is not None else None,
                 "fp16": fp16_path if built.fp16 is not None else None}
        version = log_run(run, result, files, tokenizer_dir, tok, model_path,
                          evaluated_scores(eval_metrics), parent)
    _report(result, version)


def _ort_version() -> str:
    import onnxruntime as ort

    return ort.__version__


def _report(result: dict, version: str | None) -> None:
    line = (f"export: greedy parity {result['greedy_parity']:.1%}, beam-{result['beam_size']} "
            f"parity {result['beam_parity']:.1%} on {result['parity_sentences']} test sentences; "
            f"model.onnx {result['fp32_size_mb']} MB, BLEU {result['fp32_bleu']}, "
            f"{result['fp32_sentences_per_s']} sent/s")
    if "int8_bleu" in result:
        line += (f"; model.int8.onnx {result['int8_size_mb']} MB, BLEU {result['int8_bleu']}, "
                 f"{result['int8_sentences_per_s']} sent/s")
    if "fp16_size_mb" in result:
        line += f"; model.fp16.onnx {result['fp16_size_mb']} MB ({result['fp16_checked']})"
    if version is not None:
        line += f"; registered version {version} (alias candidate)"
    print(line)


if __name__ == "__main__":
    run_cli(app)
