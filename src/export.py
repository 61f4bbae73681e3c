"""export: models/model.pt + models/tokenizer -> models/model.onnx, one file with the whole search.

Reads params `export.*`; the languages come from models/tokenizer/tokenizer.json. Builds the
single-file generation graph of src/onnx_graph.py (encoder, KV-cached decoder and beam/greedy
search under one BeamSearch node, special ids, languages, limits and tokenizer fingerprints in
metadata_props) and verifies it before it is moved into place: `onnx.checker`, then ONNX Runtime
against PyTorch's `src.nmt.search` on the first `export.parity_sentences` test sentences
(greedy must match token for token; beam top hypotheses in at least `export.min_beam_parity`
of the rows), then BLEU of the file on the whole test split. With `export.quantize`,
models/model.int8.onnx (int8 weights, quantized per subgraph) gets its own BLEU and speed.

Each file gets a text-in, text-out twin (src/graph/text_graph.py: SentencePiece inside the graph),
checked to translate the parity sentences exactly as its generation model does.

Writes models/model.onnx and models/model.text.onnx (DVC outs), models/model.int8.onnx and
models/model.int8.text.onnx (not DVC outs: DVC requires declared outs to exist, and these are
optional), models/export_metrics.json (BLEU, size and
speed of each file: the DVC metrics) and models/export_stats.json (also parity, timings and the
onnxruntime version). MLflow gets
the text-in, text-out model of src/serving.py (both files and the tokenizer as artifacts),
registered as a new version of `nmt-<src>-<tgt>` with the alias `candidate`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import onnx
import torch
import typer

from src.core import paths, tracking
from src.core.atomic import atomic_path
from src.core.cli import run_cli
from src.core.errors import PipelineError, require_file
from src.core.params import ExportParams, load_params
from src.core.reports import EXPORT_HEADLINE, write_report
from src.core.scoring import bleu
from src.data.subword import BOS, EOS, PAD, UNK, Tokenizers, check_encoded_with, load_tokenizers
from src.graph import onnx_graph, text_graph
from src.nmt import checkpoint
from src.nmt.search import (
    beam_search,
    greedy_search,
    length_sorted_batches,
    max_output_length,
    source_batch,
)
from src.runtime import generation

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)

SHOWN_MISMATCHES = 3  # example rows named in the error when parity fails


def model_metadata(model, tok: Tokenizers, cfg: ExportParams, tokenizer_dir: Path) -> dict:
    """Everything `src.infer` needs beside the graph, stored as metadata_props."""
    return {
        "format": generation.GRAPH_FORMAT,
        "pad_id": PAD, "unk_id": UNK, "bos_id": BOS, "eos_id": EOS,
        "source_lang": tok.source_lang,
        "target_lang": tok.target_lang,
        "source_vocab": model.config.src_vocab, "target_vocab": model.config.tgt_vocab,
        "max_source_tokens": model.max_positions,  # including the EOS the source ends with
        "max_output_tokens": model.max_positions - 1,
        "max_length_ratio": cfg.max_length_ratio,
        "beam_size": cfg.beam_size, "length_penalty": cfg.length_penalty,
        **generation.tokenizer_metadata(tokenizer_dir),
    }


def check_vocab(model, tok: Tokenizers) -> None:
    sizes = (model.config.src_vocab, model.config.tgt_vocab)
    if sizes != (tok.source_vocab, tok.target_vocab):
        raise PipelineError(f"tokenizer vocabularies {tok.source_vocab}/{tok.target_vocab} do "
                            f"not match the model's {sizes[0]}/{sizes[1]}: re-run tokenize+train")


def open_session(path: Path):
    """On the CPU, whatever the machine has: the parity check compares with PyTorch on CPU."""
    return generation.open_session(path, "cpu", os.cpu_count() or 1)


def parity(session, model, sources: list[list[int]], cfg: ExportParams) -> dict:
    """Rows where ONNX Runtime and PyTorch produce the same tokens, greedy and beam."""
    same = {"greedy": 0, "beam": 0}
    mismatches: dict[str, list[str]] = {"greedy": [], "beam": []}
    for idx in length_sorted_batches(sources, cfg.batch_size):
        src = source_batch(sources, idx, model.max_positions)
        max_len = max_output_length(src, cfg.max_length_ratio, model)
        runs = {
            "greedy": (greedy_search(model, src, max_len), 1),
            "beam": (beam_search(model, src, cfg.beam_size, max_len, cfg.length_penalty),
                     cfg.beam_size),
        }
        for mode, (expected, beam) in runs.items():
            got = generation.run_search(session, src.numpy(), max_len, beam, cfg.length_penalty)
            for i, want, have in zip(idx, expected, got):
                same[mode] += want == have
                if want != have and len(mismatches[mode]) < SHOWN_MISMATCHES:
                    mismatches[mode].append(f"test row {i}: torch {want} vs onnx {have}")
    n = len(sources)
    return {"parity_sentences": n, "greedy_parity": round(same["greedy"] / n, 4),
            "beam_parity": round(same["beam"] / n, 4), "beam_size": cfg.beam_size,
            "mismatches": mismatches}


def translate(session, sources: list[list[int]], texts: list[str], model, cfg: ExportParams):
    """Beam-search every source through the ONNX file in the batches `src.infer --input`
    makes of the same text (`generation.length_batches`: an int8 model's output depends on its
    batch), so the BLEU reported is the one a user gets; returns (ids in order, seconds)."""
    out: list[list[int]] = [[] for _ in sources]
    start = time.perf_counter()
    for idx in generation.length_batches(texts, cfg.batch_size):
        src = source_batch(sources, idx, model.max_positions)
        max_len = max_output_length(src, cfg.max_length_ratio, model)
        for i, hyp in zip(idx, generation.run_search(session, src.numpy(), max_len,
                                                     cfg.beam_size, cfg.length_penalty)):
            out[i] = hyp
    return out, time.perf_counter() - start


def score_file(path: Path, model, tok: Tokenizers, part, cfg: ExportParams) -> dict:
    """BLEU, speed and size of one ONNX file on the whole test split."""
    session = open_session(path)
    ids, seconds = translate(session, list(part["source_ids"]), list(part["source"]), model,
                             cfg)
    hypotheses = tok.decode_target(ids)
    return {"bleu": bleu(hypotheses, list(part["target"]), tok.target_lang),
            "sentences_per_s": round(len(ids) / max(seconds, 1e-9), 2),
            "size_mb": round(path.stat().st_size / 1e6, 2),
            "provider": session.get_providers()[0], "ids": ids}


def check_graph(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise PipelineError(f"{path.name} fails onnx.checker: {str(exc).splitlines()[0]}") \
            from None


def verify(path: Path, model, sources: list[list[int]], cfg: ExportParams) -> dict:
    """onnx.checker + PyTorch parity; raises PipelineError when the file is not trustworthy."""
    check_graph(path)
    result = parity(open_session(path), model, sources, cfg)
    mismatches = result.pop("mismatches")
    if result["greedy_parity"] < 1.0:
        raise PipelineError(f"greedy parity {result['greedy_parity']:.2%} < 100%: "
                            + "; ".join(mismatches["greedy"]))
    if result["beam_parity"] < cfg.min_beam_parity:
        raise PipelineError(f"beam parity {result['beam_parity']:.2%} < "
                            f"{cfg.min_beam_parity:.0%}: " + "; ".join(mismatches["beam"]))
    return result


def text_parity(generation_path: Path, text_path: Path, tokenizer_dir: Path,
                sentences: list[str], cfg: ExportParams) -> None:
    """The text model must translate every sentence exactly as its generation model run
    through the tokenizer, in the batches src.infer makes; raises PipelineError if not."""
    threads = os.cpu_count() or 1
    reference = generation.load_translator(generation_path, tokenizer_dir, "cpu", threads)
    text = generation.load_translator(text_path, None, "cpu", threads)
    encoded = [reference.encode(s, i + 1) for i, s in enumerate(sentences)]
    mismatches = []
    for idx in generation.length_batches(sentences, cfg.batch_size):
        want = reference.run([encoded[i] for i in idx], cfg.beam_size, None)
        have = text.run([sentences[i] for i in idx])
        mismatches += [f"test row {i}: {w!r} vs text model {h!r}"
                       for i, w, h in zip(idx, want, have) if w != h]
    if mismatches:
        raise PipelineError(f"{text_path.name}: {len(mismatches)} of {len(sentences)} "
                            f"sentences differ from {generation_path.name} run through the "
                            f"tokenizer: " + "; ".join(mismatches[:SHOWN_MISMATCHES]))


def write_verified(fp32, int8, paths_out: tuple[Path, Path], model, tok: Tokenizers, part,
                   cfg: ExportParams, tokenizer_dir: Path) -> dict:
    """Both files and their text twins are written to temporary siblings, checked and scored,
    and only then moved into place together: a failure (say, in the int8 check) leaves the old
    files untouched, never a new model.onnx beside a stale model.int8.onnx."""
    onnx_path, int8_path = paths_out
    result: dict = {}
    scores = {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(atomic_path(onnx_path))
        onnx.save(fp32, tmp)
        result.update(verify(tmp, model, list(part["source_ids"])[: cfg.parity_sentences], cfg))
        scores["fp32"] = score_file(tmp, model, tok, part, cfg)
        written = {"fp32": tmp}
        if int8 is not None:
            # entered later, so it is moved into place first, then model.onnx
            tmp8 = written["int8"] = stack.enter_context(atomic_path(int8_path))
            onnx.save(int8, tmp8)
            check_graph(tmp8)
            scores["int8"] = score_file(tmp8, model, tok, part, cfg)
            agree = sum(a == b for a, b in zip(scores["fp32"]["ids"], scores["int8"]["ids"]))
            result["int8_same_as_fp32"] = round(agree / max(len(part), 1), 4)
        sentences = list(part["source"])[: cfg.parity_sentences]
        for name, generation_tmp in written.items():
            final = onnx_path if name == "fp32" else int8_path
            text_tmp = stack.enter_context(atomic_path(paths.text_twin(final)))
            text_graph.wrap_file(generation_tmp, tokenizer_dir, text_tmp)
            # equal on every sentence or export fails: what varies is how many were checked
            text_parity(generation_tmp, text_tmp, tokenizer_dir, sentences, cfg)
            result[f"{name}_text_checked"] = len(sentences)
    if int8 is None:  # stale int8 files would not match model.onnx
        int8_path.unlink(missing_ok=True)
        paths.text_twin(int8_path).unlink(missing_ok=True)
    for name, score in scores.items():
        score.pop("ids")
        result.update({f"{name}_{key}": value for key, value in score.items()})
    return result


def log_run(run, result: dict, files: list[Path], tokenizer_dir: Path,
            tok: Tokenizers) -> str | None:
    """Metrics, and the MLflow model (src/serving.py) as a new registered version."""
    from src.runtime import serving

    run.log_metrics({k: v for k, v in result.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
    run.log_dict(result, "export_metrics.json")
    name = f"nmt-{tok.source_lang}-{tok.target_lang}"
    int8 = files[1] if len(files) > 1 else None
    return run.log_model(lambda: serving.log_model(files[0], int8, tokenizer_dir, name))


@app.command()
def main(model_path: Path = typer.Option(paths.MODELS / "model.pt", help="Model from `train`."),
         tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir."),
         split_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded splits (test is used)."),
         onnx_path: Path = typer.Option(paths.ONNX_MODEL, help="Generation model to write."),
         int8_path: Path = typer.Option(paths.ONNX_INT8_MODEL, help="int8 twin to write."),
         metrics: Path = typer.Option(paths.EXPORT_METRICS, help="Headline JSON (DVC metrics)."),
         stats: Path = typer.Option(paths.EXPORT_STATS, help="Everything about the export, JSON."),
         ) -> None:
    """Export model.pt to one model.onnx with the search inside, verified against PyTorch."""
    from datasets import disable_progress_bars, load_from_disk

    disable_progress_bars()
    cfg = load_params(ExportParams)
    for path, stage in ((model_path, "train"), (tokenizer_dir, "tokenize"),
                        (split_dir, "tokenize")):
        require_file(path, stage)
    torch.set_num_threads(os.cpu_count() or 1)
    model, _ = checkpoint.load_model(model_path)
    check_encoded_with(split_dir, tokenizer_dir)
    tok = load_tokenizers(tokenizer_dir)
    check_vocab(model, tok)
    part = load_from_disk(str(split_dir))["test"]
    metadata = model_metadata(model, tok, cfg, tokenizer_dir)
    params = {"export": cfg.model_dump()}
    deps = [model_path, tokenizer_dir, split_dir]
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    with tracking.stage_run("export", params, deps=deps) as run, \
            tempfile.TemporaryDirectory(prefix=".export.", dir=onnx_path.parent) as work:
        run.log_datasets(split_dir, {"test": "evaluation"})
        start = time.perf_counter()
        fp32, int8 = onnx_graph.build(model, metadata, cfg.opset,
                                      Path(work) if cfg.quantize else None)
        result = {"export_seconds": round(time.perf_counter() - start, 1)}
        result.update(write_verified(fp32, int8, (onnx_path, int8_path), model, tok, part, cfg,
                                     tokenizer_dir))
        result.update({"test_sentences": len(part), "onnxruntime": _ort_version()})
        write_report(result, stats, metrics, EXPORT_HEADLINE)
        files = [onnx_path] + ([int8_path] if int8 is not None else [])
        version = log_run(run, result, files, tokenizer_dir, tok)
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
    if version is not None:
        line += f"; registered version {version} (alias candidate)"
    print(line)


if __name__ == "__main__":
    run_cli(app)
