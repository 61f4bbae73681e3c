"""The export stage on the toy project: the single file it writes (metadata, int8, attention,
parity with PyTorch in every batch shape), what it refuses to write (a failed check keeps the
old pair), the float16 file for GPUs, and the confidence curve every file carries."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from helpers import assert_one_line_error
from onnx_checks import forced_score, infer, infer_bleu, parting_gap, session
from toy_projects import MAX_POSITIONS

from src.core.special_ids import PAD
from src.data.batching import clip_source, pad
from src.graph import onnx_graph
from src.nmt import checkpoint
from src.nmt.model import ModelConfig, Transformer
from src.nmt.search import beam_search, greedy_search, max_output_length
from src.runtime import contract, sessions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


def decoder_subgraph(path: Path) -> tuple[onnx.GraphProto, dict[str, list[int]]]:
    """The BeamSearch node's decoder graph and the shapes of the initializers it can read."""
    model = onnx.load(str(path))
    search = onnx_graph.beam_search_node(model.graph)
    decoder = next(a.g for a in search.attribute if a.name == "decoder")
    shapes = {t.name: list(t.dims) for t in [*model.graph.initializer, *decoder.initializer]}
    return decoder, shapes


EXPORTED = ("model.onnx", "model.int8.onnx", "model.text.onnx", "model.int8.text.onnx",
            "model.fp16.onnx")


def write_verified_fails(project, fp32: onnx.ModelProto, int8: onnx.ModelProto, match: str,
                         fp16: onnx.ModelProto | None = None):
    """`write_verified` of these graphs over the project's exported files must fail with
    `match`, and leave the five files as they were."""
    from datasets import load_from_disk

    from src.core.errors import PipelineError
    from src.core.params import ExportParams, load_params
    from src.data.subword import load_tokenizers
    from src.graph.verify import write_verified

    models = project / "models"
    old = {name: (models / name).read_bytes() for name in EXPORTED}
    model, _ = checkpoint.load_model(models / "model.pt")
    cfg = load_params(ExportParams, path=project / "params.yaml")
    part = load_from_disk(str(project / "data/tokenized"))["test"]
    with pytest.raises(PipelineError, match=match):
        write_verified(fp32, int8, (models / "model.onnx", models / "model.int8.onnx"), model,
                       load_tokenizers(models / "tokenizer"), part, cfg, models / "tokenizer",
                       fp16, models / "model.fp16.onnx")
    assert {name: (models / name).read_bytes() for name in EXPORTED} == old
    assert not list(models.glob(".*.tmp"))


def garbled(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with its largest float weight replaced by noise: a file that passes
    onnx.checker and runs, and translates garbage (as a broken quantization would)."""
    import numpy as np
    from onnx import numpy_helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    floats = [t for t in copy.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    largest = max(floats, key=lambda t: int(np.prod(t.dims)))
    noise = np.random.default_rng(0).normal(0, 1, list(largest.dims)).astype(np.float32)
    largest.CopyFrom(numpy_helper.from_array(noise, largest.name))
    return copy


def garbled_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """The int8 file with its largest int8 weight replaced by random bytes: a quantization
    that went wrong, in a file that passes onnx.checker and runs."""
    import numpy as np
    from onnx import numpy_helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graphs = [copy.graph, *subgraphs(copy).values()]
    ints = [t for g in graphs for t in g.initializer
            if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)]
    largest = max(ints, key=lambda t: int(np.prod(t.dims)))
    dtype = np.int8 if largest.data_type == onnx.TensorProto.INT8 else np.uint8
    info = np.iinfo(dtype)
    noise = np.random.default_rng(0).integers(info.min, info.max, list(largest.dims),
                                              endpoint=True).astype(dtype)
    largest.CopyFrom(numpy_helper.from_array(noise, largest.name))
    return copy


# -- the float16 file for GPUs -----------------------------------------------------------------
def subgraphs(model: onnx.ModelProto) -> dict[str, onnx.GraphProto]:
    """The encoder and decoder subgraphs of the file's BeamSearch node."""
    search = onnx_graph.beam_search_node(model.graph)
    return {a.name: a.g for a in search.attribute if a.type == onnx.AttributeProto.GRAPH}


def loop_bodies(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The body of each Loop in the outer graph (the greedy and the beam search)."""
    return [a.g for node in model.graph.node if node.op_type == "Loop" for a in node.attribute]


# |float16 file - fp32 model| of a log-probability, so of a score (a mean of them at length
# penalty 1). float16 keeps 11 significant bits: each weight, and each activation the CPU
# rounds, moves by up to 2^-11 (4.9e-4) of itself; the logits leave the last float16 MatMul
# rounded too, and at the tiny model's |logit| <= 13 half a float16 step is 2^-8 (0.004), so a
# log-prob (logit - logsumexp) moves ~0.008 by that rounding alone. 0.01 is that order, an
# estimate, not a proof; the worst hypothesis measured on AVX2 was 0.002 off.
FP16_TOLERANCE = 0.01


def test_export_writes_a_verified_single_file(project):
    metrics = json.loads((project / "models/export_stats.json").read_text())
    assert metrics["parity_sentences"] == 60 and metrics["test_sentences"] == 80
    # The BLEU export reports for each file is what a user of src.infer gets from it.
    assert metrics["fp32_bleu"] == infer_bleu(project, project / "models/model.onnx")
    assert metrics["int8_bleu"] == infer_bleu(project, project / "models/model.int8.onnx")
    assert metrics["fp32_provider"] == "CPUExecutionProvider"
    assert metrics["fp32_text_checked"] == metrics["int8_text_checked"] == 60
    for name in ("model.onnx", "model.int8.onnx"):
        path = project / "models" / name
        onnx.checker.check_model(str(path))
        graph = onnx.load(str(path)).graph
        assert [n.op_type for n in graph.node][-1] == "If"  # search inside the file
        assert onnx_graph.beam_search_node(graph).op_type == "BeamSearch"
    assert not list((project / "models").glob(".*"))  # no temporary file left behind


def test_metadata_and_inputs_follow_the_contract(project):
    sess = session(project / "models/model.onnx")
    meta = sess.get_modelmeta().custom_metadata_map
    assert {k: meta[k] for k in ("pad_id", "unk_id", "bos_id", "eos_id")} == \
        {"pad_id": "0", "unk_id": "1", "bos_id": "2", "eos_id": "3"}
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "zh")
    assert meta["format"] == contract.GRAPH_FORMAT
    assert set(contract.METADATA_KEYS) <= set(meta)  # all the readers' keys are written
    assert int(meta["max_source_tokens"]) == MAX_POSITIONS
    assert meta["source_tokenizer_sha256"] == sessions.sha256(
        project / "models/tokenizer/source.model")
    assert [i.name for i in sess.get_inputs()] == [  # ORT-standard, then our own switch
        *contract.SEARCH_INPUTS, contract.SCORE_SWITCH]


def test_projection_is_one_gemm_with_the_ban_as_bias(project):
    """fp32: the tied projection reads the (V, D) embedding through Gemm transB (no transposed
    copy, no per-step Transpose) and bans PAD/BOS/UNK with its bias: no op over the logits."""
    decoder, shapes = decoder_subgraph(project / "models/model.onnx")
    gemms = [n for n in decoder.node if n.op_type == "Gemm"]
    assert len(gemms) == 1 and len(gemms[0].input) == 3
    assert not [n for n in decoder.node if n.op_type == "Transpose" and n.input[0] in shapes]
    assert not [n for n in decoder.node if n.op_type in ("Where", "Gather")
                and n.input[0] == gemms[0].output[0]]


def test_int8_decoder_multiplies_every_weight_in_integers(project):
    """Before: the tied projection stayed an fp32 MatMul fed by dequantizing the whole (V, D)
    table at every step, the int8 decoder's slowest node."""
    decoder, shapes = decoder_subgraph(project / "models/model.int8.onnx")
    float_products = [n.name for n in decoder.node if n.op_type in ("MatMul", "Gemm")
                      and n.input[1] in shapes and len(shapes[n.input[1]]) == 2]
    assert float_products == []
    # per decoder layer (train_tiny has 1): self-attention q, k, v as one product, out; cross
    # q, out; FFN 2; then the projection
    assert sum(n.op_type == "MatMulInteger" for n in decoder.node) == (2 + 2 + 2) * 1 + 1
    dequantized = [n.input[0] for n in decoder.node if n.op_type == "DequantizeLinear"]
    assert not set(dequantized) & set(shapes)  # only gathered rows, never a whole table


def test_int8_weights_fit_the_16_bit_sums_of_cpus_without_vnni(project):
    """Every int8 weight within ±64 (7 bits), and some at 64: ONNX Runtime multiplies by them
    with VPMADDUBSW on AVX2, whose sum of two uint8 x int8 products saturates at 32,767.
    Before: 8-bit weights gave int8 scores up to 0.6 off PyTorch's on an AVX2 EPYC."""
    from onnx import numpy_helper

    from src.graph.verify import all_graphs

    model = onnx.load(str(project / "models/model.int8.onnx"))
    weights = [numpy_helper.to_array(t) for graph in all_graphs(model.graph)
               for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) == 64


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx"])
def test_decoder_attention_is_one_fused_node_each(project, name):
    """Each decoder attention is one MultiHeadAttention node (self with its cache, cross with
    the source mask): no per-step Softmax, key Transpose or cache Concat of the plain export."""
    decoder, _ = decoder_subgraph(project / "models" / name)
    ops = [n.op_type for n in decoder.node]
    assert ops.count("MultiHeadAttention") == 2 * 1  # self + cross, 1 decoder layer
    assert not {"Softmax", "Transpose", "Concat"} & set(ops)


def test_greedy_and_beam_match_pytorch_in_every_batch_shape(project):
    """Same tokens as src.search on mixed lengths, single rows and odd batch sizes."""
    model, _ = checkpoint.load_model(project / "models/model.pt")
    sess = session(project / "models/model.onnx")
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])
    rows = [[5, 3]] + sources[:40]  # an unusual 1-token source first
    same_beam = total = 0
    for size in (1, 7, 17):
        for start in range(0, 10 if size == 1 else len(rows), size):
            src = pad([clip_source(r, MAX_POSITIONS) for r in rows[start: start + size]])
            max_len = max_output_length(src, 2.0, model)
            got = contract.run_search(sess, src.numpy(), max_len, 1, 1.0)
            assert got == greedy_search(model, src, max_len)  # token for token
            got = contract.run_search(sess, src.numpy(), max_len, 3, 1.0)
            same_beam += sum(a == b for a, b in zip(got, beam_search(model, src, 3, max_len)))
            total += len(got)
    assert total == 10 + 2 * len(rows)
    assert same_beam >= 0.95 * total


def test_max_length_cuts_output_like_pytorch(project):
    model, _ = checkpoint.load_model(project / "models/model.pt")
    sess = session(project / "models/model.onnx")
    src = pad([[10, 11, 12, 3], [13, 3]])
    for max_len in (1, 3):
        assert contract.run_search(sess, src.numpy(), max_len, 1, 1.0) == \
            greedy_search(model, src, max_len)


def test_onnx_search_bans_pad_bos_unk_like_pytorch(tmp_path):
    """A decoder rigged so UNK, then BOS, get the largest logit: both searches must skip them."""
    from src.data.subword import BOS, UNK

    torch.manual_seed(0)
    config = ModelConfig(40, 40, d_model=16, n_heads=2, n_layers=1, ffn_dim=32, dropout=0.0,
                         max_positions=32, tie_embeddings=False)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.dec_norm.weight.fill_(0.01)
        model.dec_norm.bias.fill_(1.0)  # every decoder state ~ (1, ..., 1)
        model.generator.weight[UNK] = 5.0  # logit ~ 80: UNK would win every step
        model.generator.weight[BOS] = 4.0
    path = tmp_path / "rigged.onnx"
    onnx.save(onnx_graph.assemble(*onnx_graph.export_subgraphs(model, 18), {}), path)
    src = pad([[7, 8, 9, 3], [10, 3]])
    got = contract.run_search(session(path), src.numpy(), 6, 1, 1.0)
    assert got == greedy_search(model, src, 6)
    assert all(tok not in (0, BOS, UNK) for row in got for tok in row) and got[0]


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx"])
def test_the_cpu_files_load_without_a_warning(project, name, capfd):
    """ONNX Runtime warns on stderr about every constant a graph does not use (the greedy
    search's final step once left two): a user loading the file sees none."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 1  # warnings and above
    ort.InferenceSession(str(project / "models" / name), options,
                         providers=["CPUExecutionProvider"])
    assert "[W:onnxruntime" not in capfd.readouterr().err


def test_a_failed_int8_check_leaves_the_old_pair_untouched(project):
    """Before: model.onnx was replaced, then the int8 check failed, leaving a stale int8 twin."""
    fp32 = onnx.load(str(project / "models/model.onnx"))
    write_verified_fails(project, fp32, onnx.ModelProto(), "fails onnx.checker")


def test_a_file_that_disagrees_with_pytorch_fails_verification(project, tmp_path):
    """The parity gate itself (export's stats can only ever show a passing parity)."""
    from datasets import load_from_disk

    from src.core.errors import PipelineError
    from src.core.params import ExportParams, load_params
    from src.graph.verify import verify

    models = project / "models"
    model, _ = checkpoint.load_model(models / "model.pt")
    cfg = load_params(ExportParams, path=project / "params.yaml")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:20]
    assert verify(models / "model.onnx", model, sources, cfg)["greedy_parity"] == 1.0
    bad = tmp_path / "garbled.onnx"
    onnx.save(garbled(onnx.load(str(models / "model.onnx"))), str(bad))
    with pytest.raises(PipelineError, match=r"greedy parity \d+\.\d+% < 100%: test row"):
        verify(bad, model, sources, cfg)


def test_an_int8_file_that_scores_worse_is_not_written(project):
    """export.max_int8_drop: a garbled int8 weight costs BLEU and chrF, and export fails."""
    fp32 = onnx.load(str(project / "models/model.onnx"))
    int8 = onnx.load(str(project / "models/model.int8.onnx"))
    write_verified_fails(project, fp32, garbled_int8(int8),
                         r"model.int8.onnx scores BLEU .* below model.onnx's .*: more than "
                         r"export.max_int8_drop 1.0; neither file written")


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_the_int8_gate_judges_scores_not_agreement(metric):
    """An untrained model's near-ties flip under quantization (a smoke run's int8 file agreed
    on 63.8% of sentences at BLEU 0.0 vs 0.0 and export failed): only a score lost counts."""
    from src.core.errors import PipelineError
    from src.core.params import ExportParams, load_params
    from src.graph.verify import check_int8_quality

    cfg = load_params(ExportParams).model_copy(update={"max_int8_drop": 1.0})
    fp32 = {"bleu": 20.0, "chrf": 30.0}
    check_int8_quality(fp32, {"bleu": 19.0, "chrf": 29.0}, 318, cfg)  # at the margin: kept
    check_int8_quality({"bleu": 0.0, "chrf": 0.0}, {"bleu": 0.0, "chrf": 0.0}, 318, cfg)
    check_int8_quality(fp32, {"bleu": 25.0, "chrf": 35.0}, 318, cfg)  # better is fine
    worse = dict(fp32) | {metric: fp32[metric] - 1.01}
    with pytest.raises(PipelineError, match=f"scores {'BLEU' if metric == 'bleu' else 'chrF'} "
                                            r".* 1.01 below .* export.max_int8_drop 1.0"):
        check_int8_quality(fp32, worse, 318, cfg)


def test_the_fp16_file_is_model_onnxs_search_over_float16_layers(project):
    """Same outer inputs and outputs as model.onnx and the same two Loops (no BeamSearch node:
    every batch, one sentence too, is the Loops'); every weight float16, stored once; the
    decoder hands the search float32 logits; half the size; metadata says so."""
    fp32 = onnx.load(str(project / "models/model.onnx"))
    fp16 = onnx.load(str(project / "models/model.fp16.onnx"))
    onnx.checker.check_model(fp16)
    assert fp16.graph.input == fp32.graph.input and fp16.graph.output == fp32.graph.output
    ops = [n.op_type for n in fp16.graph.node]
    assert ops.count("Loop") == 2 and "BeamSearch" not in ops
    FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    matrices = {t.name.removesuffix("_row_normed"): tuple(t.dims) for t in fp32.graph.initializer
                if t.data_type == FLOAT and len(t.dims) == 2}  # embeddings, projections
    halves = {t.name: tuple(t.dims) for t in fp16.graph.initializer
              if t.data_type == FLOAT16 and len(t.dims) == 2}
    assert halves == matrices, set(halves.items()) ^ set(matrices.items())
    assert all(t.data_type != FLOAT for graph in [fp16.graph, *loop_bodies(fp16)]
               for t in graph.initializer)
    for body in loop_bodies(fp16):
        cast = next(n for n in body.node if n.op_type == "Cast" and n.output[0].endswith("logits"))
        assert cast.attribute[0].i == FLOAT
    # heads are static: every fused attention names the model's, as model.onnx's do
    from src.graph.verify import all_graphs

    heads = [a.i for graph in all_graphs(fp16.graph) for n in graph.node
             if n.op_type == "MultiHeadAttention" for a in n.attribute if a.name == "num_heads"]
    assert heads and set(heads) == {checkpoint.load_model(project / "models/model.pt")[0].n_heads}
    meta = {p.key: p.value for p in fp16.metadata_props}
    assert (meta["weights"], meta["runs_on"]) == ("fp16", "cuda")
    assert os.path.getsize(project / "models/model.fp16.onnx") < \
        os.path.getsize(project / "models/model.onnx")
    stats = json.loads((project / "models/export_stats.json").read_text())
    if not Path("/dev/nvidia0").exists():
        assert stats["fp16_checked"] == "structure"


@pytest.mark.parametrize("beam", [1, 3])
def test_the_fp16_file_searches_as_model_onnx(project, beam):
    """On the CPU, where ONNX Runtime runs the float16 nodes through casts of its own: the test
    split in batches of 16 and one sentence at a time. float16 rounds the scores: every
    hypothesis the fp16 file returns has the fp32 model's score, and one both files return
    model.onnx's score, within FP16_TOLERANCE. The n-best lists themselves may differ: a near
    tie the rounding flips sends the search another way, and the hypotheses it then finds need
    not score close (seen on AVX2: two candidates 0.0009 apart in log p at step 5, the kept one
    ended a step sooner and closed the list, whose third hypothesis then scored 0.054 below
    model.onnx's). So the lists are not compared, except greedy's: two greedy searches part
    only where the two tokens tie within the rounding of both (log p within 2 x
    FP16_TOLERANCE)."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    fp32, fp16 = (session(project / f"models/{name}") for name in ("model.onnx",
                                                                    "model.fp16.onnx"))
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])
    batches = [sources[i: i + 16] for i in range(0, len(sources), 16)] + \
        [[row] for row in sources[:8]]
    max_len = 30
    for rows in batches:
        rows = [clip_source(r, MAX_POSITIONS) for r in rows]
        feeds = contract.search_feeds(pad(rows).numpy(), max_len, beam, 1.0)
        feeds["num_return_sequences"] = np.array([beam], np.int32)
        # every hypothesis of the n-best lists, without BOS and padding: the operator that
        # model.onnx searches one sentence with pads them to max_length, the Loops to the longest
        want, have = (contract.parse_hypotheses(*s.run(None, feeds), PAD) for s in (fp32, fp16))
        for row, want_list, have_list in zip(rows, want, have):
            want_scores = {tuple(h.ids): h.score for h in want_list}
            for hyp in have_list:
                assert abs(hyp.score - forced_score(model, row, hyp.ids, max_len, 1.0)) <= \
                    FP16_TOLERANCE, (row, hyp)
                if tuple(hyp.ids) in want_scores:
                    assert abs(hyp.score - want_scores[tuple(hyp.ids)]) <= FP16_TOLERANCE, \
                        (row, hyp, want_list)
            if beam == 1 and have_list[0].ids != want_list[0].ids:
                assert parting_gap(model, row, have_list[0].ids, want_list[0].ids, max_len) <= \
                    2 * FP16_TOLERANCE, (row, have_list, want_list)


def test_fp16_problems_name_what_breaks_the_contract(project):
    from onnx import helper, numpy_helper

    from src.graph.verify import fp16_problems

    fp32 = onnx.load(str(project / "models/model.onnx"))
    fp16 = onnx.load(str(project / "models/model.fp16.onnx"))
    assert fp16_problems(fp16, fp32) == []
    broken = onnx.ModelProto()
    broken.CopyFrom(fp16)
    body = loop_bodies(broken)[0]
    body.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "left_over"))
    # a layer left in float32 between two casts, as the converter leaves an op it blocks
    relu = next(n for n in body.node if n.op_type == "Relu")
    body.node.append(helper.make_node("Cast", [relu.output[0]], ["relu_in_float32"],
                                      name="back_to_float32", to=onnx.TensorProto.FLOAT))
    broken.graph.input[5].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    helper.set_model_props(broken, {"format": "nmt-beamsearch-1"})
    problems = fp16_problems(broken, fp32)
    assert problems[0] == "its graph inputs differ from model.onnx's"
    assert problems[1].startswith("its metadata is not model.onnx's + weights/runs_on")
    assert problems[2] == "1 float32 initializers (left_over)"
    assert problems[3] == ("1 casts to float32 that model.onnx's search has not "
                           f"(back_to_float32 in {body.name})")
    assert len(problems) == 4
    unconverted = fp16_problems(fp32, fp32)  # model.onnx itself, as if it were the fp16 file
    assert unconverted[0].startswith("its metadata is not model.onnx's")
    assert re.fullmatch(r"\d+ float32 initializers \(.*\)", unconverted[1])
    assert unconverted[2] == "0 casts of the logits to float32 for 2 searching Loops"


def test_an_fp16_file_that_breaks_the_contract_is_not_written(project):
    fp32 = onnx.load(str(project / "models/model.onnx"))
    int8 = onnx.load(str(project / "models/model.int8.onnx"))
    write_verified_fails(project, fp32, int8, "model.fp16.onnx breaks the search contract: "
                         "its metadata is not model.onnx's", fp16=fp32)


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present")
def test_infer_refuses_the_fp16_file_without_a_gpu(project):
    result = infer(project, "hi", model=project / "models/model.fp16.onnx")
    assert_one_line_error(result, "model.fp16.onnx runs on CUDA only")


def test_every_file_carries_the_confidence_curve_fitted_on_valid(project):
    from src.runtime import confidence

    stats = json.loads((project / "models/export_stats.json").read_text())
    fitted = confidence.Calibration(**json.loads(stats["confidence"]))
    assert fitted.sentences == 40 and fitted.slope >= 0.0
    for name in ("model.onnx", "model.int8.onnx", "model.text.onnx", "model.int8.text.onnx"):
        meta = {p.key: p.value for p in onnx.load(str(project / "models" / name)).metadata_props}
        assert confidence.from_metadata(meta) == fitted, name
