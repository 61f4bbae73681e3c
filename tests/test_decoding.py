"""Ids to text, the same in every decoder: a run of byte pieces that stops short of a whole
UTF-8 character (the model emitted two of the three bytes of 丸) is dropped, not shown as
U+FFFD. On the real default model 5 of 2,104 test translations carried U+FFFD before. And a
space between two CJK characters goes ("是吧。 我也这么认为。": 27 of 2,104 test translations
of the model trained on space-joined pairs), one beside a Latin word stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import sentencepiece as spm
from onnx import TensorProto, helper
from toy_corpus import toy_pairs

from src.data.subword import BOS, EOS, PAD, Tokenizers, train_spm
from src.runtime import generation


@pytest.fixture(scope="module")
def byte_model() -> bytes:
    """A byte-fallback model: 丸 is not in the toy corpus, so it becomes three byte pieces."""
    return train_spm([side for pair in toy_pairs() for side in pair], vocab_size=320,
                     model_type="unigram", character_coverage=1.0, byte_fallback=True, seed=0)


@pytest.fixture(scope="module")
def sp(byte_model) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=byte_model)


def rows(sp) -> list[list[int]]:
    """猫, two stray bytes of 丸, 狗, EOS; a whole 丸 in bytes; an empty row; two sentences and
    two words joined by spaces, with a Latin word among them."""
    cat, dog = sp.encode("两只猫"), [sp.piece_to_id("狗")]  # 狗 without a leading "▁"
    assert dog != [sp.unk_id()]
    stray = [sp.piece_to_id("<0xE4>"), sp.piece_to_id("<0xB8>")]
    assert all(sp.is_byte(i) for i in stray) and not any(sp.is_byte(i) for i in cat + dog)
    whole = sp.encode("一只丸")
    assert sum(sp.is_byte(i) for i in whole) == 3
    spaced = sp.encode("两只猫。 两只 狗。")
    latin = sp.encode("两只 cat 猫")
    assert sp.decode(spaced) == "两只猫。 两只 狗。"
    return [cat + stray + dog + [EOS], whole + [EOS], [EOS], spaced + [EOS], latin + [EOS]]


WANT = ["两只猫狗", "一只丸", "", "两只猫。两只狗。", "两只 cat 猫"]


def test_decode_target_drops_a_broken_byte_run_and_keeps_a_whole_one(sp):
    assert "\ufffd" in sp.decode(rows(sp)[0][:-1])  # what SentencePiece itself returns
    tokenizers = Tokenizers(source=sp, target=sp, meta={})
    assert tokenizers.decode_target(rows(sp)) == WANT


def test_the_onnx_translator_drops_it_too(sp, monkeypatch):
    searched = [[BOS, *row, *[PAD] * (12 - len(row))] for row in rows(sp)]
    monkeypatch.setattr(generation, "run_search", lambda *args: np.array(searched))
    translator = generation.Translator(
        session=None, source=sp, target=sp,
        meta={"eos_id": str(EOS), "pad_id": str(PAD), "max_output_tokens": "40",
              "length_penalty": "1.0"})
    assert translator.run([[5, EOS]] * len(WANT), beam=1, max_length=12) == WANT


def test_decoding_starts_no_threads_and_a_lone_row_decodes_as_in_a_batch(sp):
    """SentencePiece's batch decode starts a thread on every call for two rows or more, even
    with `num_threads=1`: at batch 32 that cost 4.7% of int8 greedy's sentences/s
    (docs/engines.md). So each row is decoded alone, with no options."""
    from src.data.subword import decode_ids

    calls = []

    class Recording:
        def decode(self, ids, **options):
            calls.append((ids, options))
            return sp.decode(ids, **options)

    assert decode_ids(Recording(), rows(sp)) == WANT
    assert [decode_ids(Recording(), [row]) for row in rows(sp)] == [[w] for w in WANT]
    assert decode_ids(Recording(), []) == []
    assert decode_ids(Recording(), [[EOS, PAD]]) == [""]
    assert len(calls) == 2 * len(WANT) + 1
    assert all(options == {} and all(isinstance(i, int) for i in ids) for ids, options in calls)


def test_the_text_graph_decodes_as_python_does(byte_model, sp):
    """The decode half of the text-in text-out graph, alone: (B, N, T) ids and each row's
    source piece count in, strings out, (B, N) and the first of each row (a row with no source
    pieces stays blank)."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime_extensions import get_library_path

    from src.graph.text_twin import CONTRIB_DOMAIN, _decode_nodes

    nodes, consts = _decode_nodes(byte_model)
    graph = helper.make_graph(
        nodes, "decode",
        [helper.make_tensor_value_info("sequences", TensorProto.INT32, ["B", "N", "T"]),
         helper.make_tensor_value_info("row_pieces", TensorProto.INT64, ["B"])],
        [helper.make_tensor_value_info("translation", TensorProto.STRING, ["B"]),
         helper.make_tensor_value_info("translations", TensorProto.STRING, ["B", "N"])],
        initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(CONTRIB_DOMAIN, 1)])
    model.ir_version = 9  # what onnxruntime 1.20 reads, as export writes
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    width = max(len(r) for r in rows(sp)) + 1
    ids = np.array([[[BOS, *r, *[PAD] * (width - 1 - len(r))]] for r in rows(sp)], np.int32)
    pieces = np.arange(2, 2 + len(WANT), dtype=np.int64)
    got, lists = session.run(None, {"sequences": ids, "row_pieces": pieces})
    assert list(got) == WANT and lists.tolist() == [[w] for w in WANT]
    pieces[0] = 0
    (got, _) = session.run(None, {"sequences": ids, "row_pieces": pieces})
    assert list(got) == ["", *WANT[1:]]
    # two hypotheses per sentence: each row's list in order, the second the next row's text
    pairs = np.concatenate([ids, np.roll(ids, -1, axis=0)], axis=1)  # (B, 2, T)
    got, lists = session.run(None, {"sequences": pairs, "row_pieces": pieces})
    assert list(got) == ["", *WANT[1:]]
    assert lists.tolist() == [["", ""], *([w, n] for w, n in zip(WANT[1:], [*WANT[2:], WANT[0]]))]
