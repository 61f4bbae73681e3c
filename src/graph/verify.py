"""Whether an exported file can be trusted, before it is moved into place: `onnx.checker`,
ONNX Runtime against PyTorch's search (greedy token for token, beam in at least
`export.min_beam_parity` of the rows), its BLEU and speed on the test split in the batches
`src.infer` makes, and its text twin translating exactly as the file with the tokenizer. The
confidence curve (src/runtime/confidence.py) is fitted here, on the valid split with model.onnx's
own scores, and stored in every file's metadata."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import onnx

from src.core import paths
from src.core.atomic import atomic_path
from src.core.cpus import usable_cpus
from src.core.errors import PipelineError
from src.core.metrics import score as corpus_scores
from src.core.metrics import sentence_chrf
from src.core.params import ExportParams
from src.core.special_ids import EOS, PAD
from src.data.batching import clip_source
from src.data.subword import Tokenizers
from src.graph import text_twin
from src.nmt.search import (
    beam_search,
    greedy_search,
    length_sorted_batches,
    max_output_length,
    source_batch,
)
from src.runtime import confidence, contract, generation, placement, sessions
from src.runtime.batch_graph import OPERATOR_OUTPUTS
from src.runtime.length_batches import length_batches

SHOWN_MISMATCHES = 3  # example rows named in the error when parity fails


def open_session(path: Path):
    """On the CPU, whatever the machine has: the parity check compares with PyTorch on CPU."""
    return sessions.open_session(path, "cpu", usable_cpus())


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
            got = contract.run_search(session, src.numpy(), max_len, beam, cfg.length_penalty)
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
    makes of the same text (`length_batches` by source tokens: an int8 model's
    output depends on its batch), so the BLEU reported is the one a user gets; returns (ids
    in order, seconds)."""
    out: list[list[int]] = [[] for _ in sources]
    lengths = {i: len(clip_source(ids, model.max_positions)) for i, ids in enumerate(sources)}
    start = time.perf_counter()
    for idx in length_batches(texts, cfg.batch_size, lengths):
        src = source_batch(sources, idx, model.max_positions)
        max_len = max_output_length(src, cfg.max_length_ratio, model)
        for i, hyp in zip(idx, contract.run_search(session, src.numpy(), max_len,
                                                   cfg.beam_size, cfg.length_penalty)):
            out[i] = hyp
    return out, time.perf_counter() - start


def score_file(path: Path, model, tok: Tokenizers, part, cfg: ExportParams) -> dict:
    """BLEU, speed and size of one ONNX file on the whole test split."""
    session = open_session(path)
    ids, seconds = translate(session, list(part["source_ids"]), list(part["source"]), model,
                             cfg)
    hypotheses = tok.decode_target(ids)
    scores = corpus_scores(hypotheses, list(part["target"]), tok.target_lang)
    return {"bleu": scores["bleu"], "chrf": scores["chrf"],
            "sentences_per_s": round(len(ids) / max(seconds, 1e-9), 2),
            "size_mb": round(path.stat().st_size / 1e6, 2),
            "provider": session.get_providers()[0], "ids": ids}


def calibrate(path: Path, model, tok: Tokenizers, valid, cfg: ExportParams
              ) -> confidence.Calibration:
    """The confidence curve of a file, fitted on the valid split: its beam search's scores
    (as exported) against whether each translation's sentence chrF reaches the threshold."""
    session = open_session(path)
    sources = list(valid["source_ids"])
    found: list = [None] * len(sources)
    for idx in length_sorted_batches(sources, cfg.batch_size):
        src = source_batch(sources, idx, model.max_positions)
        max_len = max_output_length(src, cfg.max_length_ratio, model)
        hyps = contract.run_search_scored(session, src.numpy(), max_len, cfg.beam_size,
                                          cfg.length_penalty, PAD)
        for i, (best, *_) in zip(idx, hyps):
            found[i] = (best, len(best.ids) + (len(best.ids) < max_len))
    texts = tok.decode_target([best.ids for best, _ in found])
    chrf = sentence_chrf(texts, list(valid["target"]))
    features = [confidence.mean_logp(best.score, tokens, cfg.length_penalty)
                for best, tokens in found]
    return confidence.fit(features, [c >= confidence.CHRF_THRESHOLD for c in chrf])


SCORE_TOLERANCE = 1e-4  # |ONNX - PyTorch| of any token's log-probability in the scoring file


def check_scorer(path: Path, model, part, cfg: ExportParams) -> dict:
    """The scoring file's token log-probabilities against PyTorch's teacher forcing on
    `export.parity_sentences` test pairs; raises PipelineError beyond SCORE_TOLERANCE."""
    import numpy as np
    import torch

    from src.graph.likelihood_graph import token_logprobs
    from src.runtime.likelihood import SCORE_INPUTS, SCORE_OUTPUT

    check_graph(path)
    session = open_session(path)
    sources = [clip_source(ids, model.max_positions)
               for ids in list(part["source_ids"])[: cfg.parity_sentences]]
    eos = EOS
    targets = [list(ids)[: model.max_positions - 2] + [eos]
               for ids in list(part["target_ids"])[: cfg.parity_sentences]]
    worst = 0.0
    for idx in length_sorted_batches(targets, cfg.batch_size):
        src = contract.pad_rows([sources[i] for i in idx], PAD)
        tgt = contract.pad_rows([targets[i] for i in idx], PAD)
        got = session.run([SCORE_OUTPUT], {SCORE_INPUTS[0]: src, SCORE_INPUTS[1]: tgt})[0]
        want = token_logprobs(model, torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
        worst = max(worst, float(np.abs(got - want).max()))
    if not worst <= SCORE_TOLERANCE:
        raise PipelineError(f"{path.name}: token log-probabilities differ from PyTorch's by up "
                            f"to {worst:.2e} (> {SCORE_TOLERANCE:g}); neither file written")
    return {"score_checked": len(targets), "score_max_difference": worst}


def set_metadata(model: onnx.ModelProto, key: str, value: str) -> None:
    for prop in model.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    model.metadata_props.add(key=key, value=value)


def check_graph(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise PipelineError(f"{path.name} fails onnx.checker: {str(exc).splitlines()[0]}") \
            from None


def verify(path: Path, model, sources: list[list[int]], cfg: ExportParams) -> dict:
    """onnx.checker + PyTorch parity; raises PipelineError when the file is not trustworthy."""
    check_graph(path)
    return check_parity(open_session(path), model, sources, cfg)


def check_parity(session, model, sources: list[list[int]], cfg: ExportParams) -> dict:
    """Greedy must match PyTorch on every row, beam on `export.min_beam_parity` of them."""
    result = parity(session, model, sources, cfg)
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
    through the tokenizer, both in the batches src.infer makes for the generation model (an
    int8 model's output depends on its batch); raises PipelineError if not."""
    threads = usable_cpus()
    reference = generation.load_translator(generation_path, tokenizer_dir, "cpu", threads)
    text = generation.load_translator(text_path, None, "cpu", threads)
    encoded = [reference.encode(s, i + 1) for i, s in enumerate(sentences)]
    mismatches = []
    lengths = {i: len(ids) for i, ids in enumerate(encoded)}
    for idx in length_batches(sentences, cfg.batch_size, lengths):
        want = reference.run([encoded[i] for i in idx], cfg.beam_size, None)
        have = text.run([sentences[i] for i in idx])
        mismatches += [f"test row {i}: {w!r} vs text model {h!r}"
                       for i, w, h in zip(idx, want, have) if w != h]
    if mismatches:
        raise PipelineError(f"{text_path.name}: {len(mismatches)} of {len(sentences)} "
                            f"sentences differ from {generation_path.name} run through the "
                            f"tokenizer: " + "; ".join(mismatches[:SHOWN_MISMATCHES]))


def all_graphs(graph: onnx.GraphProto):
    """A graph and every subgraph under its nodes' attributes, depth first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from all_graphs(attribute.g)


def _float32_casts_and_constants(model: onnx.ModelProto) -> tuple[set, set]:
    """(graph name, node name or first output) of every Cast to float32, and of every float32
    Constant, in `model`'s graph and subgraphs (but the stand-ins for the BeamSearch node's
    scores where a file has no such node)."""
    float32 = onnx.TensorProto.FLOAT
    casts, constants = set(), set()
    for graph in all_graphs(model.graph):
        for n in graph.node:
            key = (graph.name, n.name or n.output[0])
            if n.op_type == "Cast" and any(a.name == "to" and a.i == float32
                                           for a in n.attribute):
                casts.add(key)
            elif n.op_type == "Constant" and n.output[0] not in OPERATOR_OUTPUTS and any(
                    a.name == "value" and a.t.data_type == float32 for a in n.attribute):
                constants.add(key)
    return casts, constants


def fp16_problems(fp16: onnx.ModelProto, fp32: onnx.ModelProto) -> list[str]:
    """What keeps a float16 file from the search contract: the outer inputs and outputs must be
    model.onnx's (int32 ids, float penalties, int32 sequences, float scores), the metadata
    model.onnx's plus `weights: fp16` and `runs_on: cuda`, and every weight float16. The
    encoder and decoder must compute in float16: the only float32 in the file is the search's
    own (model.onnx's casts and constants of the Loops: scores, penalties) and one cast per
    decoder, of its logits, which the search reads in float32."""
    problems = []
    for side in ("input", "output"):
        want = [v.SerializeToString() for v in getattr(fp32.graph, side)]
        if [v.SerializeToString() for v in getattr(fp16.graph, side)] != want:
            problems.append(f"its graph {side}s differ from model.onnx's")
    meta = {p.key: p.value for p in fp16.metadata_props}
    expected = {**{p.key: p.value for p in fp32.metadata_props}, "weights": "fp16",
                "runs_on": "cuda"}
    if meta != expected:
        differing = sorted(set(meta.items()) ^ set(expected.items()))
        problems.append(f"its metadata is not model.onnx's + weights/runs_on: {differing[:3]}")
    float32 = onnx.TensorProto.FLOAT
    tensors = [t.name for graph in all_graphs(fp16.graph) for t in graph.initializer
               if t.data_type == float32]
    if tensors:
        problems.append(f"{len(tensors)} float32 initializers ({', '.join(tensors[:3])})")
    casts, constants = _float32_casts_and_constants(fp16)
    search_casts, search_constants = _float32_casts_and_constants(fp32)
    logits_casts = {(graph.name, n.name or n.output[0]) for graph in all_graphs(fp16.graph)
                    for n in graph.node if n.op_type == "Cast" and n.output[0].endswith("logits")}
    for what, names in (("casts to float32", casts - search_casts - logits_casts),
                        ("float32 constants", constants - search_constants)):
        if names:
            shown = ", ".join(f"{name} in {graph}" for graph, name in sorted(names)[:3])
            problems.append(f"{len(names)} {what} that model.onnx's search has not ({shown})")
    loops = sum(n.op_type == "Loop" for n in fp16.graph.node)
    if len(logits_casts) != loops:
        problems.append(f"{len(logits_casts)} casts of the logits to float32 for {loops} "
                        "searching Loops")
    return problems


def check_fp16(path: Path, fp16: onnx.ModelProto, fp32: onnx.ModelProto, model,
               sources: list[list[int]], cfg: ExportParams) -> dict:
    """onnx.checker on the written file and the structure (`fp16_problems`); parity with
    PyTorch as for model.onnx where CUDA runs, else skipped with one line (the file is for
    CUDA: on the CPU, ONNX Runtime runs its float16 nodes through casts of its own)."""
    import onnxruntime as ort

    check_graph(path)
    problems = fp16_problems(fp16, fp32)
    if problems:
        raise PipelineError(f"model.fp16.onnx breaks the search contract: {problems[0]}")
    why_not = placement.cuda_unavailable_reason(ort.get_available_providers())
    if why_not:
        print(f"export: model.fp16.onnx structure checked; parity skipped ({why_not}; it runs "
              f"on CUDA only: bench.gpu_check checks it on a GPU)")
        return {"fp16_checked": "structure"}
    result = check_parity(sessions.open_session(path, "cuda"), model, sources, cfg)
    return {"fp16_checked": "structure and parity on CUDA",
            **{f"fp16_{key}": value for key, value in result.items()}}


def check_int8_quality(fp32: dict, int8: dict, sentences: int, cfg: ExportParams) -> None:
    """The int8 file may score at most `export.max_int8_drop` BLEU and chrF below model.onnx on
    the same test sentences, or export fails. Exact agreement is not the gate (it is reported):
    an undertrained model's outputs are near-ties that quantization flips without being worse,
    while a broken quantization loses points on both scores."""
    for metric, name in (("bleu", "BLEU"), ("chrf", "chrF")):
        drop = fp32[metric] - int8[metric]
        if drop > cfg.max_int8_drop:
            raise PipelineError(
                f"model.int8.onnx scores {name} {int8[metric]} on the "
                f"{sentences:,} test sentences, {drop:.2f} below model.onnx's {fp32[metric]}: "
                f"more than export.max_int8_drop {cfg.max_int8_drop}; neither file written")


def write_verified(fp32, int8, paths_out: tuple[Path, Path], model, tok: Tokenizers, part,
                   cfg: ExportParams, tokenizer_dir: Path, fp16=None,
                   fp16_path: Path | None = None, valid=None,
                   scorer: tuple[onnx.ModelProto, Path] | None = None) -> dict:
    """The files and their text twins are written to temporary siblings, checked and scored,
    and only then moved into place together: a failure (say, in the int8 check) leaves the old
    files untouched, never a new model.onnx beside a stale model.int8.onnx (or fp16). With a
    `valid` split, every file gets model.onnx's confidence curve fitted on it; `scorer` (the
    scoring graph and its path) is checked against PyTorch and written with them."""
    onnx_path, int8_path = paths_out
    result: dict = {}
    scores = {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(atomic_path(onnx_path))
        onnx.save(fp32, tmp)
        result.update(verify(tmp, model, list(part["source_ids"])[: cfg.parity_sentences], cfg))
        if valid is not None and len(valid):
            calibration = calibrate(tmp, model, tok, valid, cfg)
            for proto in (fp32, int8, fp16):
                if proto is not None:
                    set_metadata(proto, confidence.METADATA_KEY, calibration.to_metadata())
            onnx.save(fp32, tmp)
            result["confidence"] = calibration.to_metadata()
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
            check_int8_quality(scores["fp32"], scores["int8"], len(part), cfg)
        if fp16 is not None:
            tmp16 = stack.enter_context(atomic_path(fp16_path))
            onnx.save(fp16, tmp16)
            result.update(check_fp16(tmp16, fp16, fp32, model,
                                     list(part["source_ids"])[: cfg.parity_sentences], cfg))
            result["fp16_size_mb"] = round(tmp16.stat().st_size / 1e6, 2)
        if scorer is not None:
            score_tmp = stack.enter_context(atomic_path(scorer[1]))
            onnx.save(scorer[0], score_tmp)
            result.update(check_scorer(score_tmp, model, part, cfg))
        sentences = list(part["source"])[: cfg.parity_sentences]
        for name, generation_tmp in written.items():
            final = onnx_path if name == "fp32" else int8_path
            text_tmp = stack.enter_context(atomic_path(paths.text_twin(final)))
            text_twin.wrap_file(generation_tmp, tokenizer_dir, text_tmp)
            # equal on every sentence or export fails: what varies is how many were checked
            text_parity(generation_tmp, text_tmp, tokenizer_dir, sentences, cfg)
            result[f"{name}_text_checked"] = len(sentences)
    if int8 is None:  # stale int8 files would not match model.onnx
        int8_path.unlink(missing_ok=True)
        paths.text_twin(int8_path).unlink(missing_ok=True)
    if fp16 is None and fp16_path is not None:  # nor would a stale fp16 file
        fp16_path.unlink(missing_ok=True)
    for name, score in scores.items():
        score.pop("ids")
        result.update({f"{name}_{key}": value for key, value in score.items()})
    return result
