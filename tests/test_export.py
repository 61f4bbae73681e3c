"""export + infer on a tiny trained model: the single-file ONNX graph decodes exactly as
`src.search` does (greedy token for token, beam on the top hypothesis), the export stage writes
what it promises, and `python -m src.infer` handles text, stdin, files and bad input."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from helpers import REPO, assert_one_line_error, run_stage
from toy_corpus import toy_pairs
from toy_projects import EXPORT, MAX_POSITIONS, write_tokenizer

from src.core.special_ids import BANNED, BOS, EOS, PAD
from src.data.batching import clip_source, pad
from src.data.subword import train_spm
from src.graph import onnx_graph
from src.nmt import checkpoint
from src.nmt.model import ModelConfig, Transformer
from src.nmt.search import beam_search, greedy_search, max_output_length
from src.runtime import batch_graph, contract, generation, operator_graph, placement, sessions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


def infer(project: Path, *args: str, stdin: str | None = None, model: Path | None = None):
    model = model or project / "models/model.onnx"
    return run_stage(project, "infer", "--onnx", str(model), *args, stdin=stdin)


def infer_bleu(project: Path, model: Path) -> float:
    """BLEU of `src.infer --input` on the project's test split, beam as exported."""
    import sacrebleu
    from datasets import load_from_disk

    test = load_from_disk(str(project / "data/tokenized"))["test"]
    sources = project / "test.en"
    sources.write_text("".join(s + "\n" for s in test["source"]), encoding="utf-8")
    result = infer(project, "--input", str(sources), "--batch-size", str(EXPORT["batch_size"]),
                   model=model)
    assert result.returncode == 0, result.stderr
    hyps = result.stdout.splitlines()
    return round(sacrebleu.corpus_bleu(hyps, [list(test["target"])], tokenize="zh").score, 2)


def session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def forced_log_probs(model: Transformer, source: list[int], tokens: list[int]) -> torch.Tensor:
    """(len(tokens), V) log-probabilities of the fp32 model, `tokens` fed in after BOS (teacher
    forcing), PAD, BOS and UNK at -inf as the searches mask them."""
    with torch.no_grad():
        logits = model(torch.tensor([source]), torch.tensor([[BOS] + tokens[:-1]]))[0].float()
    logits[:, list(BANNED)] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


def ended(ids: list[int], max_len: int) -> list[int]:
    """A hypothesis's tokens as the search generated them: with its EOS when it ended before
    `max_len`; one of `max_len` tokens was cut there (an EOS would have been token max_len + 1)."""
    return ids + [EOS] if len(ids) < max_len else ids


def forced_score(model: Transformer, source: list[int], ids: list[int], max_len: int,
                 length_penalty: float) -> float:
    """PyTorch's score of the hypothesis `ids` (no BOS, no EOS) of one source row, whichever
    search found it: src.nmt.search's sum(log p) / length**length_penalty, length its tokens + 1
    (its EOS, whose log p counts, or the limit it was cut at: 30ee771)."""
    tokens = ended(ids, max_len)
    if not tokens:  # max_len 0: nothing generated, as the search scores it
        return 0.0
    logp = forced_log_probs(model, source, tokens)
    total = float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())
    return total / (len(ids) + 1) ** length_penalty


def parting_gap(model: Transformer, source: list[int], a: list[int], b: list[int],
                max_len: int) -> float:
    """Two different greedy hypotheses of one source: how far apart the fp32 model puts the two
    tokens at the first position where they part (EOS counted), given the prefix they share."""
    a, b = ended(a, max_len), ended(b, max_len)
    j = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    logp = forced_log_probs(model, source, a[: j + 1])[j]
    return abs(float(logp[a[j]] - logp[b[j]]))


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


def decoder_subgraph(path: Path) -> tuple[onnx.GraphProto, dict[str, list[int]]]:
    """The BeamSearch node's decoder graph and the shapes of the initializers it can read."""
    model = onnx.load(str(path))
    search = onnx_graph.beam_search_node(model.graph)
    decoder = next(a.g for a in search.attribute if a.name == "decoder")
    shapes = {t.name: list(t.dims) for t in [*model.graph.initializer, *decoder.initializer]}
    return decoder, shapes


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


# -- the search Loop (src/graph/search_loop.py) --------------------------------------------------
def test_search_loop_decodes_as_the_beamsearch_operator_and_pytorch(project, tmp_path):
    """The Loop that drops finished sentences against ORT's own BeamSearch (the same subgraphs
    assembled with search="operator") and src.nmt.search: batches of mixed lengths, fp32 and
    int8, greedy with and without min_length forcing the length, beam 3."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    encoder, decoder = onnx_graph.export_subgraphs(model, 18)
    int8 = (onnx_graph.quantize_subgraph(encoder, tmp_path),
            onnx_graph.quantize_subgraph(decoder, tmp_path))
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])
    same_beam = total_beam = 0
    for name, pair in (("fp32", (encoder, decoder)), ("int8", int8)):
        sessions = {}
        for search in ("loop", "operator"):
            path = tmp_path / f"{name}_{search}.onnx"
            onnx.save(onnx_graph.assemble(*pair, {}, search=search), path)
            sessions[search] = session(path)
        for start in range(0, len(sources), 16):
            src = pad([clip_source(r, MAX_POSITIONS) for r in sources[start: start + 16]])
            max_len = max_output_length(src, 2.0, model)
            for beam, min_length in ((1, 0), (1, max_len + 1), (3, 0), (3, 4)):
                feeds = contract.search_feeds(src.numpy(), max_len, beam, 1.0)
                # + 1 above: the BOS start token counts (a new array: the feeds' own are shared)
                feeds["min_length"] = np.array([min_length], np.int32)
                loop, operator = (contract.parse_sequences(sessions[k].run(None, feeds)[0], 0)
                                  for k in ("loop", "operator"))
                if beam == 1:
                    assert loop == operator, (name, start, min_length)
                    assert min_length == 0 or {len(row) for row in loop} == {max_len}
                else:
                    same_beam += sum(a == b for a, b in zip(loop, operator))
                    total_beam += len(loop)
            if name == "fp32":
                assert contract.run_search(sessions["loop"], src.numpy(), max_len, 1, 1.0) \
                    == greedy_search(model, src, max_len)
                got = contract.run_search(sessions["loop"], src.numpy(), max_len, 3, 1.0)
                assert got == beam_search(model, src, 3, max_len), start
    assert same_beam >= 0.95 * total_beam


def test_the_search_loop_returns_pytorchs_n_best_lists(project):
    """A batch's n-best lists come from the Loop (files since `N_BEST_BATCHES`): each
    sentence's N best hypotheses and scores, best first, as src.nmt.search's beam search ranks
    every one it finished (or, at the length limit, its live beams), N = 1 included; short
    length limits make the live beams compete."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:32]
    loop = sessions.open_batch_session(project / "models/model.onnx", "cpu", 1)
    assert loop is not None
    compared = 0
    for start in range(0, len(sources), 16):
        src = pad([clip_source(r, MAX_POSITIONS) for r in sources[start: start + 16]])
        for max_len in (max_output_length(src, 2.0, model), 3):
            for n_best in (1, 2, 3):
                lists = contract.run_search_scored(loop, src.numpy(), max_len, 3, 1.0, 0,
                                                   n_best=n_best)
                expected = beam_search(model, src, 3, max_len, 1.0, n_best=n_best)
                for hyps, want in zip(lists, expected):
                    assert [h.ids for h in hyps] == [ids for ids, _ in want]
                    np.testing.assert_allclose([h.score for h in hyps],
                                               [score for _, score in want], rtol=1e-4)
                    compared += len(want)
    assert compared > 200


@pytest.mark.parametrize("beams, batch", [(3, 1), (3, 2), (1, 2)])  # operator, beam Loop, greedy
def test_every_search_refuses_more_hypotheses_than_beams(project, beams, batch):
    """A raw client asking for beams + 1 hypotheses gets an error from each search, where the
    Loops would pad the extra places (and greedy return one); up to the beam works."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(project / "models/model.onnx"),
                                   providers=["CPUExecutionProvider"])
    src = np.array([[40, 41, 42, 3]] * batch, np.int32)
    feeds = contract.search_feeds(src, 5, beams, 1.0, n_best=beams + 1)
    # the operator's own message, or the node that refuses it for the Loops
    refusal = "num_return_sequences" if batch == 1 else onnx_graph.RETURNS_CHECK
    with pytest.raises(Exception, match=refusal):
        session.run(["sequences"], feeds)
    feeds = contract.search_feeds(src, 5, beams, 1.0, n_best=beams)
    (sequences,) = session.run(["sequences"], feeds)
    assert sequences.shape[:2] == (batch, beams)


@pytest.mark.parametrize("beam", [1, 3])
def test_one_long_and_31_short_sentences_translate_as_one_by_one(project, beam):
    """A batch whose rows finish at very different steps: the rows that end early are dropped
    (greedy) or wait (beam), and no row's translation depends on the others."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])
    by_length = sorted(sources, key=len)
    batch = by_length[:31] + by_length[-1:]
    translator = generation.load_translator(project / "models/model.onnx", threads=1)
    together = translator.translate(batch, beam, batch_size=32)
    alone = [translator.translate([line], beam, batch_size=1)[0] for line in batch]
    assert together == alone
    assert len(set(together)) > 20  # real, different translations


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx", "model.text.onnx"])
def test_a_batch_is_searched_without_the_operator_and_translates_the_same(project, name,
                                                                        monkeypatch):
    """A batch goes to the file without its BeamSearch operator (src/runtime/batch_graph.py,
    which spares it the operator's dummy step), opened on the first batch, its n-best lists
    too; one sentence stays with the file's own session; every translation and score is the one the
    file's own session gives."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:40]
    path = project / "models" / name
    translator = generation.load_translator(path, threads=1)
    opened = []
    open_batch = translator.open_batch
    translator.open_batch = lambda: opened.append(open_batch()) or opened[-1]
    assert translator.session_for(1) is translator.session
    assert opened == []  # nothing opened before a batch comes
    batched = translator.translate_scored(sources, batch_size=7)
    (batch_session,) = opened  # once, for all six batches
    assert batch_session is not None and batch_session is not translator.session
    assert translator.session_for(7) is batch_session
    assert translator.session_for(1) is translator.session
    with monkeypatch.context() as patch:  # the file as written, not its operator alone
        patch.setattr(generation, "open_operator_session", lambda *_, **__: None)
        whole = generation.load_translator(path, threads=1)
    whole.open_batch = None  # every batch through the file as written
    assert whole.translate_scored(sources, batch_size=7) == batched
    assert whole.translate(sources, batch_size=7) == translator.translate(sources, batch_size=7)
    assert len({hyps[0].text for hyps in batched}) > 20  # real, different translations
    # a lone line takes a shorter way than a batch of one sentence: the same translations
    alone = [translator.translate([source])[0] for source in sources[:12]]
    assert alone == translator.translate(sources[:12], batch_size=1)
    assert translator.translate(["  "]) == [""] and translator.translate_scored([""]) == [()]
    assert [translator.translate_scored([source], n_best=2)[0] for source in sources[:12]] \
        == translator.translate_scored(sources[:12], batch_size=1, n_best=2)
    assert whole.translate_scored(sources, batch_size=7, n_best=2) \
        == translator.translate_scored(sources, batch_size=7, n_best=2)
    cut = onnx.load_from_string(batch_graph.without_operator(path.read_bytes()))
    ops = {n.op_type for n in cut.graph.node}
    assert "BeamSearch" not in ops and "Loop" in ops


def test_no_room_for_the_batch_search_is_a_warning_and_the_file_as_written(project, tmp_path,
                                                                          monkeypatch):
    """The file as written translates each batch as the searches cut from it do. (int8
    quantizes activations per batch, so a batch is compared with the same batch, never with
    its sentences one by one.)"""
    import contextlib

    lines = ["I have three cats.", "Where is the station?", "It is raining."]
    usual = generation.load_translator(project / "models/model.int8.onnx", threads=1)
    want = usual.translate(lines, batch_size=3), [usual.translate([ln])[0] for ln in lines]
    monkeypatch.setattr(sessions.tempfile, "TemporaryDirectory", lambda **_: (
        contextlib.nullcontext(str(tmp_path / "gone"))))  # writing there fails
    warnings: list[str] = []
    translator = generation.load_translator(project / "models/model.int8.onnx", threads=1,
                                            warn=warnings.append)
    together = translator.translate(lines, batch_size=3)
    assert translator.session_for(3) is translator.session
    assert warnings == ["one sentence goes through model.int8.onnx as written (no room for "
                        "its search alone: No such file or directory)",
                        "batches go through model.int8.onnx as written (no room for its batch "
                        "search: No such file or directory)"]
    assert (together, [translator.translate([line])[0] for line in lines]) == want


def test_requests_in_threads_open_the_batch_session_once(project):
    """The served model's requests come from a thread pool: the first batches, side by side,
    open one batch session between them."""
    from concurrent.futures import ThreadPoolExecutor

    translator = generation.load_translator(project / "models/model.int8.onnx", threads=1)
    opened = []
    open_batch = translator.open_batch

    def slow_open():
        time.sleep(0.2)  # every thread asks while the first is still opening
        opened.append(open_batch())
        return opened[-1]

    translator.open_batch = slow_open
    lines = ["I have three cats.", "Where is the station?", "It is raining."]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: translator.translate(lines, batch_size=3), range(4)))
    assert len(opened) == 1 and opened[0] is not None
    assert results == [results[0]] * 4


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx"])
def test_one_sentence_is_searched_by_the_operator_alone_and_translates_the_same(project, name):
    """One sentence and n-best lists go to the file as its BeamSearch operator alone, each
    subgraph holding its weights (src/runtime/operator_graph.py): every translation and score is
    the one the file's own session gives."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:12]
    path = project / "models" / name
    alone = onnx.load_from_string(operator_graph.operator_only(path.read_bytes()))
    assert [n.op_type for n in alone.graph.node] == ["Equal", "Not", "Cast", "BeamSearch"]
    subgraph_reads = [{i for n in a.g.node for i in n.input}
                      for a in alone.graph.node[-1].attribute
                      if a.type == onnx.AttributeProto.GRAPH]
    outer = {t.name for t in alone.graph.initializer} - {"pad_id"}
    assert outer and all(outer <= reads for reads in subgraph_reads)  # only the tied weights
    translator = generation.load_translator(path, threads=1)
    ops = {op for _, op in placement.assignments(translator.session)}
    assert "BeamSearch" in ops and "Loop" not in ops  # the operator alone, not the file
    file_metadata = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert translator.meta == file_metadata  # read from the session, as from the file
    whole = generation.Translator(sessions.open_session(path, "cpu", 1),
                                  translator.meta, translator.source, translator.target)
    for beam in (1, 3):
        for n_best in (1, 2) if beam > 1 else (1,):
            got = translator.translate_scored(sources, beam, batch_size=1, n_best=n_best)
            assert got == whole.translate_scored(sources, beam, batch_size=1, n_best=n_best)
    assert len({hyps[0].text for hyps in got}) > 8  # real, different translations


def test_a_text_twin_keeps_its_own_session(project):
    """The text twin's search sits between its tokenizer nodes: it is not cut."""
    path = project / "models/model.text.onnx"
    assert operator_graph.operator_only(path.read_bytes()) is None
    assert sessions.open_operator_session(path, "cpu", 1) is None


def test_an_operator_only_file_searches_batches_with_its_own_session(project, tmp_path):
    """A file whose batches are the operator's (no Loop beside it, as before the Loops):
    nothing to cut; nor in the fp16 file, whose Loops search every batch (no operator)."""
    model, _ = checkpoint.load_model(project / "models/model.pt")
    operator_only = tmp_path / "operator_only.onnx"
    onnx.save(onnx_graph.assemble(*onnx_graph.export_subgraphs(model, 18), {},
                                  search="operator"), operator_only)
    for path in (operator_only, project / "models/model.fp16.onnx"):
        assert batch_graph.without_operator(path.read_bytes()) is None
        assert operator_graph.operator_only(path.read_bytes()) is None
    assert sessions.open_batch_session(operator_only, "cpu", 1) is None


def test_infer_translates_a_sentence_argument(project):
    result = infer(project, "I have three cats.", "--beam", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and result.stdout.strip()
    assert "CPUExecutionProvider" in result.stderr  # says which provider ran


def test_infer_stdin_keeps_empty_lines_and_warns_on_long_ones(project):
    long_line = " ".join(["She likes three dogs."] * 30)  # far past 48 tokens
    text = "I have three cats.\n\nWe see two birds.\n" + long_line + "\n"
    result = infer(project, stdin=text)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 5 and lines[4] == ""  # 4 lines in, 4 out (+ final newline)
    assert lines[0] and lines[1] == "" and lines[2] and lines[3]
    assert "warning: line 4" in result.stderr and "truncated" in result.stderr
    assert "Traceback" not in result.stderr


def test_infer_file_in_batches_equals_line_by_line(project, tmp_path):
    source = tmp_path / "en.txt"
    source.write_text("He sees one bird.\nThey like ten horses.\n\nYou have four fish.\n")
    out = tmp_path / "zh.txt"
    result = infer(project, "--input", str(source), "--output", str(out), "--batch-size", "2")
    assert result.returncode == 0, result.stderr
    batched = out.read_text().split("\n")
    assert len(batched) == 5 and batched[2] == ""
    one_by_one = infer(project, stdin=source.read_text()).stdout.split("\n")
    assert batched == one_by_one


def test_infer_errors_are_one_line(project, tmp_path):
    assert_one_line_error(infer(project, "hi", model=tmp_path / "missing.onnx"),
                          "model not found")
    corrupt = tmp_path / "corrupt" / "model.onnx"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\x08\x07 this is not a protobuf" * 10)
    shutil.copytree(project / "models/tokenizer", corrupt.parent / "tokenizer")
    assert_one_line_error(infer(project, "hi", model=corrupt), "cannot load model")
    assert_one_line_error(infer(project, "hi", "--provider", "tpu"), "--provider")


def test_infer_invalid_utf8_on_stdin_is_one_line_naming_the_line(project):
    result = run_stage(project, "infer", "--onnx", str(project / "models/model.onnx"),
                       stdin_bytes=b"one cat\ntwo dogs\n\xc3\x28 broken\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == result.stderr.strip().splitlines()[-1:]  # one error line, at the end
    assert "<stdin>: not UTF-8 text at line 3" in errors[0]
    assert len(result.stdout.splitlines()) == 2  # the lines before it were translated


def test_infer_output_file_is_readable_like_any_file(project, tmp_path):
    import os

    source = tmp_path / "in.txt"
    source.write_text("one cat\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    result = infer(project, "--input", str(source), "--output", str(out))
    assert result.returncode == 0, result.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_infer_refuses_a_tokenizer_that_does_not_match(project, tmp_path):
    other = train_spm([e for e, _ in toy_pairs()], vocab_size=60, model_type="unigram",
                      character_coverage=1.0, byte_fallback=False, seed=0)
    write_tokenizer(tmp_path / "tok", other)
    result = infer(project, "hi", "--tokenizer", str(tmp_path / "tok"))
    assert_one_line_error(result, "does not match the model")
    lonely = tmp_path / "alone" / "model.onnx"
    lonely.parent.mkdir()
    shutil.copy(project / "models/model.onnx", lonely)
    assert_one_line_error(infer(project, "hi", model=lonely), "tokenizer not found")


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present")
def test_infer_cuda_without_gpu_is_a_clear_error(project):
    assert_one_line_error(infer(project, "hi", "--provider", "cuda"), "not available")


def test_infer_imports_neither_torch_nor_training_code():
    code = ("import sys, src.infer; heavy = {'torch', 'onnx', 'datasets', 'src.nmt.model', "
            "'src.nmt.search', 'src.graph.onnx_graph'} & set(sys.modules); print(sorted(heavy))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx", "model.text.onnx",
                                  "model.int8.text.onnx"])
def test_translating_with_any_file_never_imports_torch(project, name):
    """torch is installed here: opening and running a file must still not import it. The text
    files' operator library came from importing onnxruntime_extensions, whose package imports
    torch (2 s, 250 MB), and it was loaded for every file, text or not."""
    code = ("import sys; from pathlib import Path; from src.runtime import generation; "
            "t = generation.load_translator(Path(sys.argv[1])); "
            "print(t.translate(['She sees five rabbits.'])); "
            "print(sorted({'torch', 'onnxruntime_extensions'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code, str(project / "models" / name)],
                            cwd=REPO, capture_output=True, text=True, check=True)
    translations, loaded = result.stdout.strip().splitlines()[-2:]
    assert translations.startswith("['") and loaded == "[]"
    cli = ("import sys, runpy; sys.argv = ['infer', '--onnx', sys.argv[1], 'Hi.']; "
           "import atexit; atexit.register(lambda: print(sorted({'torch'} & set(sys.modules)), "
           "file=sys.stderr)); runpy.run_module('src.infer', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", cli, str(project / "models" / name)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "[]"


def help_defaults(module: str) -> dict[str, str]:
    """`--option: default` as `python -m <module> --help` prints them, on a wide terminal."""
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, text=True,
                            capture_output=True, env={**os.environ, "COLUMNS": "400"}, check=True)
    return dict(re.findall(r"(--[a-z-]+)\b.*?\[default: ([^\]]+)\]", result.stdout))


def test_int8_model_runs_through_infer(project):
    result = infer(project, "She sees five rabbits.", model=project / "models/model.int8.onnx")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    # where its nodes run, and the thread count --help promises unless --threads says otherwise
    # (the help said an int8 model ran on one thread while it ran on two)
    promised = help_defaults("src.infer")["--threads"]
    assert re.search(rf"^infer: CPUExecutionProvider \d+ nodes, {promised} threads$",
                     result.stderr, re.M)
    forced = infer(project, "Hi.", "--threads", "1", model=project / "models/model.int8.onnx")
    assert re.search(r"^infer: CPUExecutionProvider \d+ nodes, 1 thread$", forced.stderr, re.M)


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


def test_a_failed_int8_check_leaves_the_old_pair_untouched(project):
    """Before: model.onnx was replaced, then the int8 check failed, leaving a stale int8 twin."""
    fp32 = onnx.load(str(project / "models/model.onnx"))
    write_verified_fails(project, fp32, onnx.ModelProto(), "fails onnx.checker")


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


# -- the float16 file for GPUs -----------------------------------------------------------------
def subgraphs(model: onnx.ModelProto) -> dict[str, onnx.GraphProto]:
    """The encoder and decoder subgraphs of the file's BeamSearch node."""
    search = onnx_graph.beam_search_node(model.graph)
    return {a.name: a.g for a in search.attribute if a.type == onnx.AttributeProto.GRAPH}


def loop_bodies(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    """The body of each Loop in the outer graph (the greedy and the beam search)."""
    return [a.g for node in model.graph.node if node.op_type == "Loop" for a in node.attribute]


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


# |float16 file - fp32 model| of a log-probability, so of a score (a mean of them at length
# penalty 1). float16 keeps 11 significant bits: each weight, and each activation the CPU
# rounds, moves by up to 2^-11 (4.9e-4) of itself; the logits leave the last float16 MatMul
# rounded too, and at the tiny model's |logit| <= 13 half a float16 step is 2^-8 (0.004), so a
# log-prob (logit - logsumexp) moves ~0.008 by that rounding alone. 0.01 is that order, an
# estimate, not a proof; the worst hypothesis measured on AVX2 was 0.002 off.
FP16_TOLERANCE = 0.01


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


# -- text in, text out (src/text_graph.py) ------------------------------------------------------
TEXT_MODELS = {"model.text.onnx": "model.onnx", "model.int8.text.onnx": "model.int8.onnx"}


def test_text_model_takes_strings_and_returns_strings(project):
    model = onnx.load(str(project / "models/model.text.onnx"))
    graph = model.graph
    assert [(i.name, i.type.WhichOneof("value")) for i in graph.input] == [
        ("text", "tensor_type"), ("num_beams", "tensor_type"),
        ("num_return_sequences", "tensor_type"), ("length_penalty", "tensor_type"),
        (contract.SCORE_SWITCH, "optional_type")]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.STRING
    defaults = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in graph.initializer}
    # left out: the export's search, one hypothesis
    assert (defaults["num_beams"], defaults["num_return_sequences"]) == ([3], [1])
    assert [(o.name, o.type.tensor_type.elem_type) for o in graph.output] == [
        ("translation", onnx.TensorProto.STRING), ("score", onnx.TensorProto.FLOAT),
        ("translations", onnx.TensorProto.STRING), ("scores", onnx.TensorProto.FLOAT)]
    ops = [n.op_type for n in graph.node]
    assert ops[0] == "SentencepieceTokenizer" and "If" in ops and "Loop" in ops
    assert onnx_graph.beam_search_node(graph).op_type == "BeamSearch"
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["format"] == contract.TEXT_FORMAT and meta["beam_size"] == "3"
    assert defaults["length_penalty"] == pytest.approx([float(meta["length_penalty"])])


@pytest.mark.parametrize("text_name", TEXT_MODELS)
def test_text_model_translates_the_test_split_as_infer_does(project, text_name):
    """Same file of sentences (plus a blank line), same translations, no tokenizer files."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])
    lines = project / "text_parity.en"
    lines.write_text("".join(s + "\n" for s in sources[:40] + [""] + sources[40:]),
                     encoding="utf-8")
    runs = {}
    for name in (text_name, TEXT_MODELS[text_name]):
        result = infer(project, "--input", str(lines), model=project / "models" / name)
        assert result.returncode == 0, result.stderr
        assert "precompiled_charsmap" not in result.stderr  # SentencePiece's INFO line, dropped
        runs[name] = result.stdout.splitlines()
    assert runs[text_name] == runs[TEXT_MODELS[text_name]]
    assert runs[text_name][40] == "" and len(runs[text_name]) == len(sources) + 1


def test_both_translators_batch_a_file_alike_by_source_tokens(project, monkeypatch):
    """int8 models quantize activations per batch, so a translation may change with its batch
    neighbours: the text model and the generation model must group a file identically (once
    one sorted by tokens and the other by characters: 133 of 2,104 int8 test translations
    differed on the real model). Both sort by source tokens, which pads least."""
    lines = ["He ran.", "", "Unbelievably.", "I see a cat.", "Tom is a big boy.", "Run!",
             "Whatever happens, happens.", "It is, is it not?", "Go.", "Absolutely not.",
             "A b c d e f.", "Xylophones, zithers.", "Ok."]
    models = project / "models"
    batches: dict[str, list[list[str]]] = {"model.onnx": [], "model.text.onnx": []}
    generation_model = generation.load_translator(models / "model.onnx", threads=1)
    line_of = {tuple(generation_model.encode(line, 0)): line for line in lines if line}
    monkeypatch.setattr(generation_model, "run", lambda rows, beam, max_length: batches[
        "model.onnx"].append([line_of[tuple(r)] for r in rows]) or [""] * len(rows))
    text_model = generation.load_translator(models / "model.text.onnx", threads=1)
    monkeypatch.setattr(text_model, "run", lambda texts, beam: batches["model.text.onnx"].append(
        list(texts)) or [""] * len(texts))
    for translator in (generation_model, text_model):
        translator.translate(lines, batch_size=4)
    assert batches["model.onnx"] == batches["model.text.onnx"]
    tokens = {line: len(generation_model.encode(line, 0)) for line in lines if line}
    in_order = [line for batch in batches["model.onnx"] for line in batch]
    assert in_order == sorted(tokens, key=lambda line: (tokens[line], lines.index(line)))
    assert in_order != sorted(tokens, key=lambda line: (len(line), lines.index(line)))


def test_text_model_refuses_search_settings_it_does_not_have(project):
    text = project / "models/model.text.onnx"
    refused = infer(project, "Hello.", "--max-length", "5", model=text)
    assert_one_line_error(refused, "a text model searches as exported (output length by ratio")
    assert "for --max-length," in refused.stderr and "--beam" not in refused.stderr  # it takes one
    assert_one_line_error(infer(project, "Hello.", "--tokenizer",
                                str(project / "models/tokenizer"), model=text),
                          "drop --tokenizer")


@pytest.mark.parametrize("source", ["model.onnx", "model.int8.onnx"])  # int8: the README's
def test_text_graph_cli_writes_a_greedy_twin(project, tmp_path, source):
    greedy = tmp_path / "greedy.text.onnx"
    result = run_stage(project, "text_graph", str(project / "models" / source),
                       "--beam", "1", "--output", str(greedy))
    assert result.returncode == 0, result.stderr
    sentence = "She sees five rabbits."
    want = infer(project, sentence, "--beam", "1", model=project / "models" / source)
    got = infer(project, sentence, model=greedy)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout and got.stdout.strip()


def test_text_graph_cli_sets_the_length_penalty(project, tmp_path):
    """--length-penalty reaches the twin's search (and its metadata), as --beam does."""
    from datasets import load_from_disk

    models = project / "models"
    twin = tmp_path / "lp.text.onnx"
    result = run_stage(project, "text_graph", str(models / "model.onnx"), "--beam", "3",
                       "--length-penalty", "0.6", "--output", str(twin))
    assert result.returncode == 0, result.stderr
    text = generation.load_translator(twin, threads=1)
    assert (text.meta["beam_size"], float(text.meta["length_penalty"])) == ("3", 0.6)
    reference = generation.load_translator(models / "model.onnx", models / "tokenizer", threads=1)
    reference.meta["length_penalty"] = "0.6"
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:30]
    assert text.translate(sources) == reference.translate(sources, 3)


def test_text_parity_fails_when_the_text_model_decodes_differently(project, tmp_path):
    """A text model wrapped with another target SentencePiece model must be refused."""
    from src.core.errors import PipelineError
    from src.core.params import ExportParams, load_params
    from src.graph.text_twin import wrap_file
    from src.graph.verify import text_parity

    models = project / "models"
    other = tmp_path / "tokenizer"
    other.mkdir()
    (other / "source.model").write_bytes((models / "tokenizer/source.model").read_bytes())
    pairs = toy_pairs()
    (other / "target.model").write_bytes(train_spm(
        [z[::-1] for _, z in pairs], vocab_size=120, model_type="unigram",
        character_coverage=1.0, byte_fallback=False, seed=0))
    wrong = tmp_path / "wrong.text.onnx"
    wrap_file(models / "model.onnx", other, wrong)
    cfg = load_params(ExportParams, path=project / "params.yaml")
    with pytest.raises(PipelineError, match="differ from model.onnx"):
        text_parity(models / "model.onnx", wrong, models / "tokenizer",
                    [e for e, _ in pairs[:20]], cfg)


# -- the same weights in CTranslate2 (src/to_ctranslate2.py) --------------------------------------
@pytest.mark.parametrize("beam", [1, 3])
def test_ctranslate2_conversion_translates_as_our_model(project, tmp_path, beam):
    """Converted weights + ct2_options: CTranslate2 gives our exact translations."""
    import ctranslate2
    import sentencepiece as spm
    from datasets import load_from_disk

    from src.to_ctranslate2 import convert, ct2_options, pieces

    models = project / "models"
    ct2_dir = convert(models / "model.pt", models / "tokenizer", tmp_path / "ct2")
    sp = spm.SentencePieceProcessor(model_file=str(models / "tokenizer/target.model"))
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=1)
    ours = generation.load_translator(models / "model.onnx", threads=1)
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:40]
    want = ours.translate(sources, beam, batch_size=1)
    got = []
    for line in sources:
        tokens = sp.encode(line, out_type=str) + ["</s>"]
        new = contract.max_new_tokens(len(tokens), float(ours.meta["max_length_ratio"]),
                                      int(ours.meta["max_output_tokens"]))
        result = translator.translate_batch([tokens], **ct2_options(
            pieces(sp), beam, new, float(ours.meta["length_penalty"])))
        got.append(sp.decode(result[0].hypotheses[0]))
    assert got == want and any(want)


def test_ctranslate2_cli_finds_the_project_whatever_the_working_directory(project, tmp_path):
    """Its defaults are the project's models/ (src.core.paths), like every stage's; they used
    to be relative to the working directory."""
    env = {**os.environ, "NMT_ROOT": str(project), "NMT_TRACKING": "off"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "src.to_ctranslate2"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (project / "models/ct2/model.bin").is_file() and not (tmp_path / "models").exists()


def test_ctranslate2_missing_is_one_instruction(project, tmp_path, monkeypatch):
    from src.core.errors import PipelineError
    from src.to_ctranslate2 import convert

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    models = project / "models"
    with pytest.raises(PipelineError, match=r"ctranslate2 is not installed: pip install -e "
                                            r"'\.\[ctranslate2\]'"):
        convert(models / "model.pt", models / "tokenizer", tmp_path / "ct2")


def test_a_failed_ctranslate2_conversion_keeps_the_old_directory(project, tmp_path,
                                                                 monkeypatch):
    from src import to_ctranslate2

    old = tmp_path / "ct2"
    old.mkdir()
    (old / "model.bin").write_bytes(b"the previous conversion")
    real_build = to_ctranslate2.build_spec

    def build_then_fail_on_save(*args):
        spec = real_build(*args)

        def save(directory):
            (Path(directory) / "model.bin").write_bytes(b"half")
            raise OSError(28, "No space left on device")

        spec.save = save
        return spec

    monkeypatch.setattr(to_ctranslate2, "build_spec", build_then_fail_on_save)
    models = project / "models"
    with pytest.raises(OSError, match="No space left"):
        to_ctranslate2.convert(models / "model.pt", models / "tokenizer", old)
    assert (old / "model.bin").read_bytes() == b"the previous conversion"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no half-written sibling


def test_engine_benchmark_checks_both_engines_agree(project, tmp_path):
    """bench.engines_vs_ctranslate2 end to end on the tiny model: CTranslate2 on the converted
    weights gives our fp32 translations on every test sentence, and each timing row names
    both engines."""
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--models",
         str(project / "models"), "--split-dir", str(project / "data/tokenized"),
         "--sentences", "8", "--threads", "1", "--beams", "1", "--batches", "4",
         "--precisions", "fp32", "--repeats", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    quality = [r for r in rows if r["kind"] == "quality"]
    assert [(r["precision"], r["identical"], r["sentences"]) for r in quality] == \
        [("fp32", 1.0, 80)]
    assert quality[0]["bleu_ours"] == quality[0]["bleu_ctranslate2"]
    speed = [r for r in rows if r["kind"] == "speed"]
    assert [(r["threads"], r["beam"], r["batch"], r["sentences"], r["repeats"])
            for r in speed] == [(1, 1, 4, 8, 2)]


def test_engine_benchmark_times_n_best_lists_and_a_baseline(project, tmp_path):
    """--n-best 2 makes both engines return two scored hypotheses (their first ones still
    agree); --baseline times our files of another dir as a third engine."""
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--models",
         str(project / "models"), "--split-dir", str(project / "data/tokenized"),
         "--sentences", "8", "--threads", "1", "--beams", "2", "--batches", "4",
         "--precisions", "fp32", "--repeats", "1", "--n-best", "2", "--baseline",
         str(project / "models"), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    quality = [r for r in rows if r["kind"] == "quality"]
    assert quality[0]["identical"] == 1.0 and quality[0]["beam"] == 4
    (speed,) = [r for r in rows if r["kind"] == "speed"]
    assert speed["n_best"] == 2 and speed["ours_baseline_sent_per_s"] > 0
    assert "ours_vs_baseline" in speed
    refused = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--beams", "1,4",
         "--n-best", "2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--n-best 2 needs every beam" in refused.stderr


def test_engine_benchmark_forces_both_engines_to_one_length(project, tmp_path):
    """--force-length 6: every pass of both engines returns exactly 6 tokens per sentence (a
    worker stops otherwise, so the run would fail), greedy and beam; no quality rows, since
    forced outputs are not translations."""
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--models",
         str(project / "models"), "--split-dir", str(project / "data/tokenized"),
         "--sentences", "8", "--threads", "1", "--beams", "1,2", "--batches", "4",
         "--precisions", "fp32", "--repeats", "1", "--force-length", "6", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kind"], r["beam"], r["force_length"]) for r in rows] == \
        [("speed", 1, 6), ("speed", 2, 6)]
    refused = subprocess.run(
        [sys.executable, "-m", "bench.engines_vs_ctranslate2", "--force-length", "6",
         "--scores"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not with --scores or --n-best" in refused.stderr


def test_profile_script_shares_the_run_out_by_operator(project):
    """bench.file_profile on the tiny int8 model: the search's control nodes listed
    apart, the int8 products among the leaf operators, every share below 100%."""
    def profile(*options: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-m", "bench.file_profile",
             str(project / "models/model.int8.onnx"), "--split-dir",
             str(project / "data/tokenized"), "--top", "5", *options],
            cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    lines = profile("--sentences", "8", "--batch", "4", "--beam", "1")
    assert "8 sentences" in lines[0]
    assert any(line.split()[:2] == ["control", "Loop"] for line in lines)
    assert "ms per sentence" in lines[1]  # the share outside session.run
    leaves = [line for line in lines[2:] if not line.strip().startswith("control")]
    assert len(leaves) == 5 and any("DynamicQuantizeMatMul" in line for line in leaves)
    assert all(0 < float(line.split("%")[0].split()[-1]) < 100 for line in leaves)
    # one sentence is profiled as the runtime searches it: the operator alone, no Loop
    controls = [line.split()[1]
                for line in profile("--sentences", "3", "--batch", "1", "--beam", "2")
                if line.split()[:1] == ["control"]]
    assert "BeamSearch" in controls and "Loop" not in controls and "If" not in controls
    # --scores profiles the scored translation (greedy's LogSoftmax then has rows to run on)
    def operators(*options: str) -> tuple[set[str], str]:
        lines = profile("--sentences", "8", "--batch", "4", "--beam", "1", "--top", "80",
                        *options)
        return {line.split()[0] for line in lines[2:]}, lines[0]

    plain, plain_head = operators()
    scored, scored_head = operators("--scores")
    assert "LogSoftmax" in scored and "DynamicQuantizeMatMul" in plain
    assert scored_head.endswith("scores returned") and "scores" not in plain_head


# -- scores and n-best lists (issue 57) ----------------------------------------------------------
SCORE_TOLERANCE = {"fp32": 1e-4, "int8": 0.05}  # |ONNX - PyTorch| of a hypothesis's score


def test_scores_are_pytorchs_for_greedy_and_beam_in_every_search(project):
    """Each file's score of every hypothesis it returns is the score PyTorch gives that
    hypothesis (`forced_score`): one sentence (ONNX Runtime's BeamSearch operator) and batches
    (the Loops), greedy and beam 3, fp32 and int8 (the int8 weights move scores a little), at
    the split's output limit and at 4 tokens, where most hypotheses are cut.

    Whether the file's search finds PyTorch's hypotheses is not asserted, not even fp32's: a
    near tie within float32 rounding, which kernels summing in another order may flip, sends a
    search another way on some CPU, and no bound holds for where it then goes."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])
    worst = {}
    for name in ("fp32", "int8"):
        sess = session(project / ("models/model.onnx" if name == "fp32"
                                  else "models/model.int8.onnx"))
        for size in (1, 16):
            for start in range(0, 8 if size == 1 else len(sources), size):
                rows = [clip_source(r, MAX_POSITIONS) for r in sources[start: start + size]]
                src = pad(rows)
                for max_len in (max_output_length(src, 2.0, model), 4):
                    for beam in (1, 3):
                        got = contract.run_search_scored(sess, src.numpy(), max_len, beam, 1.0,
                                                         PAD)
                        for row, (hyp,) in zip(rows, got):
                            off = abs(hyp.score - forced_score(model, row, hyp.ids, max_len, 1.0))
                            worst[name] = max(worst.get(name, 0.0), off)
                        if name == "int8":
                            continue
                        # forced_score is PyTorch's search score, cut hypotheses included
                        want = beam_search(model, src, beam, max_len, 1.0, with_scores=True)
                        for row, (ids, score) in zip(rows, want):
                            assert forced_score(model, row, ids, max_len, 1.0) == \
                                pytest.approx(score, abs=1e-5), (row, ids, max_len)
    assert worst["fp32"] <= SCORE_TOLERANCE["fp32"], worst
    assert worst["int8"] <= SCORE_TOLERANCE["int8"], worst


def test_a_batch_asked_for_no_scores_skips_them_and_decodes_the_same(project):
    """Greedy search of a batch with the score switch off returns the same sequences and
    scores of 0 (its LogSoftmax runs on no rows); left out, the switch is on."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:16]
    src = pad([clip_source(r, MAX_POSITIONS) for r in sources])
    feeds = contract.search_feeds(src.numpy(), max_output_length(src, 2.0, model), 1, 1.0)
    for name in ("model.onnx", "model.int8.onnx"):
        sess = session(project / "models" / name)
        default = sess.run(None, feeds)
        on = sess.run(None, {**feeds, contract.SCORE_SWITCH: np.array([1], np.int32)})
        off = sess.run(None, {**feeds, contract.SCORE_SWITCH: np.array([0], np.int32)})
        assert np.array_equal(default[0], off[0]) and np.array_equal(default[0], on[0])
        assert np.array_equal(default[1], on[1]) and (on[1] != 0).all()
        assert (off[1] == 0).all(), name


class FeedRecorder:
    """A session that records the score switch of every run."""

    def __init__(self, real, switches: list):
        self.real, self.switches = real, switches

    def get_inputs(self):
        return self.real.get_inputs()

    def run(self, names, feeds):
        switch = feeds.get(contract.SCORE_SWITCH)
        self.switches.append(None if switch is None else int(switch[0]))
        return self.real.run(names, feeds)


@pytest.mark.parametrize("name", ["model.onnx", "model.text.onnx"])
def test_translating_without_scores_turns_the_switch_off(project, name):
    translator = generation.load_translator(project / "models" / name, threads=1)
    switches: list = []  # a batch of two and one of one: each session records
    translator.session = FeedRecorder(translator.session, switches)
    open_batch = translator.open_batch
    translator.open_batch = lambda: FeedRecorder(open_batch(), switches)
    lines = ["I have three cats.", "Where is the station?", "It is raining."]
    plain = translator.translate(lines, batch_size=2)
    assert switches == [0, 0]
    scored = translator.translate_scored(lines, batch_size=2)
    assert switches == [0, 0, 1, 1]
    assert [s[0].text for s in scored] == plain


def test_compare_files_times_each_file_with_and_without_scores(project):
    result = subprocess.run(
        [sys.executable, "-m", "bench.files_speed_ab", str(project / "models"),
         "--scores", "--split-dir", str(project / "data/tokenized"), "--sentences", "8",
         "--repeats", "2", "--beams", "1", "--batches", "4", "--precisions", "int8"],
        capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert f"{project / 'models'}+scores:" in line and "(median of 2 rounds)" in line
    assert line.endswith("identical to the first: 100.0%")  # scores change no translation


def test_compare_files_times_a_file_whole_against_its_batch_cut(project):
    models = str(project / "models")
    result = subprocess.run(
        [sys.executable, "-m", "bench.files_speed_ab", models, models, "--whole-first",
         "--split-dir", str(project / "data/tokenized"), "--sentences", "8", "--repeats", "2",
         "--beams", "1", "--batches", "4", "--precisions", "int8"],
        capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert f"{models}(whole): " in line and f"  {models}: " in line
    assert line.endswith("identical to the first: 100.0%")  # the cut changes no translation


def test_compare_files_times_the_text_twins_as_written(project, tmp_path):
    """--text times model.text.onnx (the only file in the directory) as it was written."""
    models = tmp_path / "twin"
    models.mkdir()
    (models / "model.text.onnx").symlink_to(project / "models/model.text.onnx")
    result = subprocess.run(
        [sys.executable, "-m", "bench.files_speed_ab", str(models), "--text",
         "--split-dir", str(project / "data/tokenized"), "--sentences", "8", "--repeats", "2",
         "--beams", "1", "--batches", "4", "--precisions", "fp32", "--scores"],
        capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith("fp32 threads 1 beam as written batch 4: ")
    assert line.endswith("identical to the first: 100.0%")


def test_an_n_best_list_is_distinct_and_ordered_best_first(project):
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:16]
    sess = session(project / "models/model.onnx")
    src = pad([clip_source(r, MAX_POSITIONS) for r in sources])
    max_len = max_output_length(src, 2.0, model)
    lists = contract.run_search_scored(sess, src.numpy(), max_len, 3, 1.0, 0, n_best=3)
    best = beam_search(model, src, 3, max_len, 1.0)
    assert {len(hyps) for hyps in lists} == {3}
    for hyps in lists:
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.ids) for h in hyps}) == 3
    assert sum(hyps[0].ids == ids for hyps, ids in zip(lists, best)) >= 0.9 * len(best)


@pytest.mark.parametrize("name", ["model.onnx", "model.text.onnx"])
def test_a_file_of_the_retired_format_is_refused_in_one_line(project, tmp_path, name):
    """A file written before this version's contract (metadata `format` nmt-beamsearch-1 or
    nmt-text-1) is refused by infer, the site and the text twin, saying to export again."""
    model = onnx.load(str(project / "models" / name))
    retired = dict(zip(["model.onnx", "model.text.onnx"], contract.RETIRED_FORMATS))[name]
    next(p for p in model.metadata_props if p.key == "format").value = retired
    old = tmp_path / name
    onnx.save(model, old)
    shutil.copytree(project / "models/tokenizer", tmp_path / "tokenizer")
    assert_one_line_error(infer(project, "Hello.", model=old),
                          f"was written by an older version of the export (format {retired}; "
                          f"this version reads {contract.GRAPH_FORMAT} and "
                          f"{contract.TEXT_FORMAT}): export it again with python -m src.export")
    if name == "model.onnx":
        from src.core.errors import PipelineError
        from src.graph.text_twin import wrap

        with pytest.raises(PipelineError, match="older version of the export"):
            wrap(model, b"", b"")


def test_the_text_twin_returns_the_generation_files_scores(project):
    from datasets import load_from_disk

    lines = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:40]
    text = generation.load_translator(project / "models/model.text.onnx", threads=1)
    ids = generation.load_translator(project / "models/model.onnx", threads=1)
    from_text = text.translate_scored(lines, batch_size=16)
    from_ids = ids.translate_scored(lines, batch_size=16)
    assert [t[0].text for t in from_text] == [t[0].text for t in from_ids]
    assert max(abs(t[0].score - i[0].score) for t, i in zip(from_text, from_ids)) < 1e-5


@pytest.mark.parametrize("batch_size", [1, 16])  # one sentence: the operator; more: the Loop
def test_the_text_twin_returns_the_generation_files_n_best_lists(project, batch_size):
    from datasets import load_from_disk

    lines = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:24]
    lines.insert(5, "")
    text = generation.load_translator(project / "models/model.text.onnx", threads=1)
    ids = generation.load_translator(project / "models/model.onnx", threads=1)
    from_text = text.translate_scored(lines, batch_size=batch_size, n_best=3)
    from_ids = ids.translate_scored(lines, batch_size=batch_size, n_best=3)
    assert from_text[5] == () and {len(hyps) for hyps in from_text if hyps} == {3}
    assert [[h.text for h in hyps] for hyps in from_text] == [
        [h.text for h in hyps] for hyps in from_ids]
    assert max(abs(t.score - i.score) for t_hyps, i_hyps in zip(from_text, from_ids)
               for t, i in zip(t_hyps, i_hyps)) < 1e-5
    best = text.translate(lines, batch_size=batch_size)
    assert [hyps[0].text if hyps else "" for hyps in from_text] == best


@pytest.mark.parametrize("batch_size", [1, 16])
def test_the_text_twin_searches_with_the_beam_it_is_given(project, batch_size):
    """A beam other than the file's (3): the generation file's translations and n-best lists
    at that beam, through the operator (one sentence) and the Loop (a batch)."""
    from datasets import load_from_disk

    lines = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:24]
    text = generation.load_translator(project / "models/model.text.onnx", threads=1)
    ids = generation.load_translator(project / "models/model.onnx", threads=1)
    for beam in (1, 4):
        assert text.translate(lines, beam, batch_size=batch_size) == ids.translate(
            lines, beam, batch_size=batch_size)
    from_text = text.translate_scored(lines, 4, batch_size=batch_size, n_best=4)
    from_ids = ids.translate_scored(lines, 4, batch_size=batch_size, n_best=4)
    assert [[h.text for h in hyps] for hyps in from_text] == [
        [h.text for h in hyps] for hyps in from_ids]
    assert {len(hyps) for hyps in from_text} == {4}  # more than the file's beam of 3


def test_infer_writes_a_text_twins_n_best_list(project):
    lines = "I have three cats.\n\nWhere is the station?\n"
    runs = [infer(project, "--n-best", "2", "--format", "jsonl", stdin=lines,
                  model=project / "models" / name) for name in ("model.text.onnx", "model.onnx")]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    from_text, from_ids = ([json.loads(line) for line in run.stdout.splitlines()]
                           for run in runs)
    assert [[h["text"] for h in r["hypotheses"]] for r in from_text] == [
        [h["text"] for h in r["hypotheses"]] for r in from_ids]
    assert len(from_text[0]["hypotheses"]) == 2 and from_text[1]["hypotheses"] == []
    assert from_text[0]["confidence"] == pytest.approx(from_ids[0]["confidence"], abs=1e-5)
    assert_one_line_error(infer(project, "--n-best", "4", "Hello.",
                                model=project / "models/model.text.onnx"),
                          "n-best 4: a search with beam 3 returns 1 to 3")


def test_infer_writes_n_best_lists_as_json_lines_and_tsv(project):
    lines = "I have three cats.\n\nWhere is the station?\n"
    plain = infer(project, "--beam", "3", stdin=lines).stdout.splitlines()
    result = infer(project, "--beam", "3", "--n-best", "2", "--format", "jsonl", stdin=lines)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert [r["source"] for r in records] == lines.splitlines()
    assert records[1]["hypotheses"] == [] and records[1]["confidence"] is None
    for record, text in zip((records[0], records[2]), (plain[0], plain[2])):
        first, second = record["hypotheses"]
        assert first["text"] == text and first["score"] >= second["score"]
        assert first["tokens"] >= 1 and 0.0 <= record["confidence"] <= 1.0
    tsv = infer(project, "--beam", "3", "--scores", stdin=lines)
    assert tsv.returncode == 0, tsv.stderr
    rows = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [("1", "1"), ("3", "1")]
    assert [r[4] for r in rows] == [plain[0], plain[2]]
    assert float(rows[0][2]) == pytest.approx(records[0]["hypotheses"][0]["score"], abs=1e-5)
    assert float(rows[0][3]) == pytest.approx(records[0]["confidence"], abs=1e-5)


@pytest.mark.parametrize("args, fragment", [
    (["--n-best", "4", "--beam", "3"], "n-best 4: a search with beam 3 returns 1 to 3"),
    (["--format", "xml"], "--format must be one of text, tsv, jsonl, not 'xml'"),
    (["--format", "text", "--scores"], "--format text writes translations only"),
])
def test_infer_refuses_impossible_output_requests(project, args, fragment):
    assert_one_line_error(infer(project, *args, "Hello."), fragment)


def test_infer_n_best_zero_is_a_usage_error(project):
    result = infer(project, "--n-best", "0", "Hello.")
    assert result.returncode == 2 and "--n-best" in result.stderr


def test_every_file_carries_the_confidence_curve_fitted_on_valid(project):
    from src.runtime import confidence

    stats = json.loads((project / "models/export_stats.json").read_text())
    fitted = confidence.Calibration(**json.loads(stats["confidence"]))
    assert fitted.sentences == 40 and fitted.slope >= 0.0
    for name in ("model.onnx", "model.int8.onnx", "model.text.onnx", "model.int8.text.onnx"):
        meta = {p.key: p.value for p in onnx.load(str(project / "models" / name)).metadata_props}
        assert confidence.from_metadata(meta) == fitted, name


# -- scoring given translations (src.score, models/model.score.onnx) ------------------------------
def test_the_scoring_file_gives_pytorchs_teacher_forced_log_probabilities(project, tmp_path):
    from datasets import load_from_disk

    from src.graph.likelihood_graph import token_logprobs

    test = load_from_disk(str(project / "data/tokenized"))["test"]
    pairs = list(zip(test["source"], test["target"]))[:30]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    result = run_stage(project, "score", str(tsv), "--onnx",
                       str(project / "models/model.score.onnx"), "--format", "jsonl",
                       "--batch-size", "7")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["source"], r["target"]) for r in records] == pairs
    model, _ = checkpoint.load_model(project / "models/model.pt")
    for record, src_ids, tgt_ids in zip(records, test["source_ids"], test["target_ids"]):
        want = token_logprobs(model, torch.tensor([list(src_ids) + [3]]),
                              torch.tensor([list(tgt_ids) + [3]]))[0].tolist()
        assert record["tokens"] == len(want) and record["pieces"][-1] == "</s>"
        assert max(abs(a - b) for a, b in zip(record["token_logprobs"], want)) < 1e-4
        assert record["logprob"] == pytest.approx(sum(want), abs=1e-3)


def test_a_reference_is_likelier_than_its_garbled_copy(project, tmp_path):
    """The score orders translations as it must: each test reference against the same
    characters shuffled."""
    from datasets import load_from_disk

    test = load_from_disk(str(project / "data/tokenized"))["test"]
    rng = random.Random(0)
    rows = []
    for source, target in list(zip(test["source"], test["target"]))[:40]:
        garbled = "".join(rng.sample(target, len(target)))
        rows += [f"{source}\t{target}\n", f"{source}\t{garbled}\n"]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(rows), encoding="utf-8")
    result = run_stage(project, "score", str(tsv), "--onnx",
                       str(project / "models/model.score.onnx"))
    assert result.returncode == 0, result.stderr
    means = [float(line.split("\t")[2]) for line in result.stdout.splitlines()]
    better = sum(ref > garbled for ref, garbled in zip(means[::2], means[1::2]))
    assert better >= 36  # of 40 (a shuffle can leave a short reference nearly as it was)


@pytest.mark.parametrize("content, fragment", [
    ("Hello.\t你好。\nno tab here\n", "line 2: 1 column(s), expected source<TAB>target"),
    ("Hello.\t\n", "line 1: empty target"),
    ("", "holds no pairs"),
])
def test_score_refuses_bad_pairs_in_one_line(project, tmp_path, content, fragment):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(content, encoding="utf-8")
    out = tmp_path / "scores.tsv"
    result = run_stage(project, "score", str(tsv), "--onnx",
                       str(project / "models/model.score.onnx"), "--output", str(out))
    assert_one_line_error(result, fragment)
    assert not out.exists()


def test_the_translation_speed_benchmark_times_every_system_on_the_same_sentences(project,
                                                                               tmp_path):
    """bench.translation_speed (docs/results.md's speed table) end to end on the tiny model:
    one row per system x beam x batch, each over the sentences asked for, each system in a
    process of its own (the ONNX ones refuse to time with torch imported), and the JSON names
    the model and the CPU."""
    out = tmp_path / "infer_speed.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.translation_speed",
         "--model", str(project / "models/model.pt"),
         "--onnx", str(project / "models/model.onnx"),
         "--int8", str(project / "models/model.int8.onnx"),
         "--data", str(project / "data/tokenized"), "--threads", "1", "--beams", "1,2",
         "--batches", "1,4", "--n", "8", "--n1", "3", "--json", str(out),
         "--model-note", "the tiny test model"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["model"] == "the tiny test model" and f"{os.cpu_count()} cores" in doc["machine"]
    rows = doc["rows"]
    assert [(r["system"], r["beam"], r["batch"], r["sentences"]) for r in rows] == [
        (system, beam, batch, 3 if batch == 1 else 8)
        for system in ("torch-nocache", "torch-cache", "onnx", "int8")
        for beam in (1, 2) for batch in (1, 4)]
    assert "| int8 | 1 | 2 | 4 |" in result.stdout  # the Markdown table results.md quotes


def decoding_choices(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.decoding_choices",
                           "--root", str(project), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_decoding_choices_search_as_each_row_says_and_leave_params_as_they_were(project,
                                                                                  tmp_path):
    """bench.decoding_choices (docs/results.md's decoding table) on the tiny model: the
    default row first, each row's beam the one evaluate searched with on both splits, a paired
    test for every row but the default, and the project's params.yaml byte for byte after."""
    params = project / "params.yaml"
    before = params.read_bytes()
    out = tmp_path / "decoding.json"
    result = decoding_choices(project, "--rows", "greedy,beam5", "--json", str(out),
                              "--model-note", "the tiny test model")
    assert result.returncode == 0, result.stderr
    assert params.read_bytes() == before
    doc = json.loads(out.read_text())
    assert doc["model"] == "the tiny test model"
    assert [(r["name"], r["beam"], "valid_p_bleu" in r) for r in doc["rows"]] == [
        ("default", 4, False), ("greedy", 1, True), ("beam5", 5, True)]


def test_the_decoding_choices_refuse_a_missing_checkpoint_before_evaluating(project, tmp_path):
    out = tmp_path / "decoding.json"
    result = decoding_choices(project, "--rows", "best-checkpoint", "--json", str(out))
    assert result.returncode == 2
    assert "models/checkpoints/best.pt not found" in result.stderr.strip().splitlines()[-1]
    assert not out.exists()
