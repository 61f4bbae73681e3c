"""The text twins (strings in, strings out; src/graph/text_twin.py) of the exported toy project:
their inputs, outputs and metadata, translations, scores and n-best lists as the generation
file's, and `python -m src.text_graph`."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from helpers import assert_one_line_error, run_stage
from onnx_checks import infer
from toy_corpus import toy_pairs

from src.data.subword import train_spm
from src.graph import onnx_graph
from src.runtime import contract, generation

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


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
