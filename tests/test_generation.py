"""The translators' own logic (src/runtime/generation.py), with ONNX Runtime's session replaced
by a recorder that answers as our files do: which session a batch or an n-best list goes to,
the feeds, the n-best lists with their scores, lengths and confidence, blank lines, the
refusals, and what a file's metadata must say. The real files are in tests/test_export.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from src.core.errors import PipelineError
from src.runtime import confidence, generation
from src.runtime.contract import (
    GRAPH_FORMAT,
    RETIRED_FORMATS,
    SCORE_SWITCH,
    TEXT_FORMAT,
    TEXT_SOURCE_TOKENIZER,
)

# The file's special ids differ from the project's defaults (EOS 3, PAD 0), so a translator that
# used the defaults instead of its file's metadata would show.
BOS, UNK, EOS, PAD = 2, 4, 5, 9
META = {"format": GRAPH_FORMAT, "eos_id": str(EOS), "pad_id": str(PAD), "beam_size": "4",
        "max_source_tokens": "6", "max_output_tokens": "8", "max_length_ratio": "1.5",
        "length_penalty": "1.0"}


class Chars:
    """A tokenizer of one id per character (ids above EOS), as SentencePiece is called."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


class Session:
    """Answers `run` with `reply(names, feeds)` and records every call."""

    def __init__(self, reply, inputs=("input_ids", SCORE_SWITCH), provider="CPUExecutionProvider"):
        self.reply, self.inputs, self.provider, self.calls = reply, inputs, provider, []

    def get_inputs(self):
        return [SimpleNamespace(name=name) for name in self.inputs]

    def get_providers(self):
        return [self.provider]

    def run(self, names, feeds):
        self.calls.append((list(names), {k: np.asarray(v).tolist() for k, v in feeds.items()}))
        self.dtypes = {k: np.asarray(v).dtype for k, v in feeds.items()}
        return self.reply(names, feeds)


def echo_search(names, feeds):
    """Each row's source reversed (without EOS and padding) as hypothesis 1, the source as is
    as hypothesis 2, then with its first id dropped, and so on; scores -1, -2, ... Every
    hypothesis starts with UNK, a special id below the file's EOS that decoding drops."""
    src = feeds["input_ids"]
    n = int(feeds["num_return_sequences"][0])
    longest = int(feeds["max_length"][0])
    rows, scores = [], []
    for row in src.tolist():
        ids = [t for t in row if t not in (EOS, PAD)]
        hyps = [ids[::-1]] + [ids[k - 2:] for k in range(2, n + 1)]
        hyps = [[UNK, *h][: longest - 1] for h in hyps]
        rows.append([[BOS, *h, *[PAD] * (longest - 1 - len(h))] for h in hyps])
        scores.append([-1.0 * (k + 1) for k in range(n)])
    out = {"sequences": np.array(rows, np.int32), "sequences_scores": np.array(scores, np.float32)}
    return [out[name] for name in names]


def translator(meta=None, session=None, batch=None, warn=None) -> generation.Translator:
    meta = META | (meta or {})
    session = session or Session(echo_search)
    open_batch = (lambda: batch) if batch is not None else None
    return generation.Translator(session, meta, Chars(), Chars(), warn=warn or (lambda m: None),
                                 open_batch=open_batch)


# -- which session searches -------------------------------------------------------------------

def test_one_sentence_goes_to_the_files_own_session_and_a_batch_to_the_batch_session():
    own, batch = Session(echo_search), Session(echo_search)
    model = translator(session=own, batch=batch)
    assert model.session_for(1) is own and model.session_for(2) is batch
    assert translator(session=own).session_for(5) is own  # no batch session to open
    no_room = translator(session=own, batch=None)
    no_room.open_batch = lambda: None  # the file has no cut
    assert no_room.session_for(5) is own


def test_the_batch_session_is_opened_once():
    opened = []
    model = translator()
    model.open_batch = lambda: opened.append(1) or Session(echo_search)
    first = model.session_for(2)
    assert model.session_for(4) is first and opened == [1]


# -- feeds and outputs ------------------------------------------------------------------------

def test_lines_are_encoded_with_eos_and_cut_to_the_limit_with_a_warning():
    warnings = []
    model = translator(warn=warnings.append)
    assert model.encode("abc", 1) == [97, 98, 99, EOS]
    assert model.encode("abcdefg", 9) == [97, 98, 99, 100, 101, EOS]  # limit 6 - 1 for EOS
    assert warnings == ["line 9: 7 tokens, truncated to the model's limit of 5"]
    assert model.encode("abcde", 2) == [97, 98, 99, 100, 101, EOS] and len(warnings) == 1


def test_output_length_by_ratio_or_asked_and_never_past_the_model():
    model = translator()
    assert model.new_tokens(2, None) == min(int(1.5 * 2) + 10, 8) == 8
    assert translator(meta={"max_output_tokens": "100"}).new_tokens(4, None) == 16
    assert model.new_tokens(2, 5) == 5 and model.new_tokens(2, 50) == 8


def test_translate_restores_the_order_and_keeps_blank_lines_blank():
    session = Session(echo_search)
    model = translator(meta={"max_output_tokens": "30"}, session=session)
    lines = ["abc", "", "de", "  ", "fghij"]
    assert model.translate(lines, batch_size=2) == ["cba", "", "ed", "", "jihgf"]
    names, feeds = session.calls[0]
    assert names == ["sequences"] and feeds[SCORE_SWITCH] == [0]
    assert feeds["num_beams"] == [4]  # the export's beam by default
    model.translate(["abc"], beam=2, max_length=3)
    names, feeds = session.calls[-1]
    assert feeds["num_beams"] == [2] and feeds["max_length"] == [4]  # + the BOS


def test_n_best_lists_carry_scores_and_lengths_as_the_search_counts_them():
    session = Session(echo_search)
    model = translator(meta={"max_output_tokens": "30"}, session=session)
    found = model.translate_scored(["abc", "", "de"], n_best=3, batch_size=8)
    assert found[1] == ()
    assert [s.text for s in found[0]] == ["cba", "abc", "bc"]
    assert [s.score for s in found[0]] == [-1.0, -2.0, -3.0]
    assert [s.tokens for s in found[0]] == [5, 5, 4]  # the ids (UNK among them) + EOS
    assert [s.text for s in found[2]] == ["ed", "de", "e"]
    names, feeds = session.calls[0]
    assert names == ["sequences", "sequences_scores"] and feeds[SCORE_SWITCH] == [1]
    assert feeds["num_return_sequences"] == [3]


def test_a_translation_cut_by_the_output_limit_has_no_eos_in_its_length():
    model = translator(meta={"max_output_tokens": "3"})
    (best,) = model.translate_scored(["abcdef"], max_length=3)[0]
    assert best.text == "ed" and best.tokens == 3  # UNK e d: no room for EOS
    (short,) = translator(meta={"max_output_tokens": "4"}).translate_scored(["ab"])[0]
    assert short.text == "ba" and short.tokens == 4  # UNK b a + EOS


@pytest.mark.parametrize("n_best, beam", [(0, 4), (5, 4), (2, 1)])
def test_an_n_best_list_longer_than_the_beam_or_empty_is_refused(n_best, beam):
    with pytest.raises(PipelineError) as caught:
        translator().translate_scored(["ab"], beam=beam, n_best=n_best)
    assert str(caught.value) == (f"n-best {n_best}: a search with beam {beam} returns 1 to "
                                 f"{beam} hypotheses (raise the beam for more)")
    generation.check_n_best(beam, beam)  # the whole beam is allowed


# -- confidence -------------------------------------------------------------------------------

def test_confidence_reads_the_files_curve_and_undoes_its_length_penalty():
    curve = confidence.Calibration(2.0, 1.0, 30.0, 100)
    model = translator(meta={"confidence": curve.to_metadata(), "length_penalty": "0.5"})
    best = generation.Scored("x", score=-2.0, tokens=4)  # mean log p: -2 x 4**0.5 / 4 = -1
    assert model.confidence(best) == pytest.approx(1 / (1 + math.exp(1.0)))
    assert model.calibration == curve
    plain = translator()
    assert plain.confidence(generation.Scored("x", -0.5, 3)) == pytest.approx(math.exp(-0.5))


def test_metadata_properties():
    model = translator()
    assert (model.default_beam, model.source_piece_limit, model.eos, model.pad) == (4, 5, 5, 9)
    assert model.provider == "CPUExecutionProvider"


# -- text models ------------------------------------------------------------------------------

TEXT_META = {"format": TEXT_FORMAT, "beam_size": "4", "max_length_ratio": "1.5",
             "max_source_tokens": "6", TEXT_SOURCE_TOKENIZER: ""}


def text_reply(names, feeds):
    """n hypotheses per line: the line upper-cased, then with 1, 2, ... appended."""
    lines = list(feeds["text"])
    n = int(feeds.get("num_return_sequences", [1])[0])
    texts = [[line.upper() + (str(k) if k else "") for k in range(n)] for line in lines]
    scores = [[-0.5 * (k + 1) for k in range(n)] for _ in lines]
    out = {"translation": np.array([row[0] for row in texts], dtype=object),
           "score": np.array([row[0] for row in scores], np.float32),
           "translations": np.array(texts, dtype=object),
           "scores": np.array(scores, np.float32)}
    return [out[name] for name in names]


def text_model(meta=None, inputs=("text", SCORE_SWITCH)) -> tuple:
    session = Session(text_reply, inputs=inputs)
    model = generation.TextTranslator(session, TEXT_META | (meta or {}))
    model.__dict__["source"] = Chars()  # the metadata's SentencePiece model, as it is called
    return model, session


def test_a_text_model_returns_n_best_lists_with_scores_in_order():
    model, session = text_model()
    found = model.translate_scored(["ab", "", "c"], n_best=2, batch_size=8)
    assert found[1] == ()
    assert [(s.text, s.score, s.tokens) for s in found[0]] == [("AB", -0.5, None),
                                                               ("AB1", -1.0, None)]
    assert [s.text for s in found[2]] == ["C", "C1"]
    names, feeds = session.calls[0]
    assert names == ["translations", "scores"] and feeds[SCORE_SWITCH] == [1]
    assert feeds["num_return_sequences"] == [2] and "num_beams" not in feeds


def test_a_text_model_takes_another_beam():
    model, session = text_model()
    assert model.translate(["ab", "cd"], beam=2) == ["AB", "CD"]
    names, feeds = session.calls[-1]
    assert names == ["translation"] and feeds["num_beams"] == [2]
    assert feeds[SCORE_SWITCH] == [0]
    feeds = model.search_feeds(None)
    assert list(feeds) == ["num_return_sequences"]
    assert feeds["num_return_sequences"].tolist() == [1]
    assert feeds["num_return_sequences"].dtype == np.int32


def test_no_text_model_takes_an_output_length():
    model, _ = text_model()
    with pytest.raises(PipelineError) as caught:
        model.translate(["ab"], max_length=5)
    assert str(caught.value) == (
        "a text model searches as exported (output length by ratio 1.5): use the generation "
        "model (model.onnx) for --max-length, or write a text model with other settings "
        "(python -m src.text_graph --help)")


def test_a_text_models_n_best_list_holds_at_most_its_beam():
    with pytest.raises(PipelineError) as caught:
        text_model()[0].translate_scored(["ab"], n_best=5)
    assert str(caught.value).startswith("n-best 5: a search with beam 4 returns 1 to 4")


def test_text_model_batches_go_by_source_tokens():
    model, _ = text_model()
    assert model.source_lengths(["abc", " ", "abcdefgh"]) == {0: 4, 2: 6}  # cut to 5, + EOS


# -- opening a file ---------------------------------------------------------------------------

def opened(monkeypatch, meta, provider="CPUExecutionProvider"):
    session = Session(echo_search, provider=provider)
    session.get_modelmeta = lambda: SimpleNamespace(custom_metadata_map=meta)
    monkeypatch.setattr(generation, "open_operator_session", lambda *a: None)
    monkeypatch.setattr(generation, "open_session", lambda *a: session)
    return session


def test_a_file_that_is_not_ours_is_refused_naming_its_format(monkeypatch, tmp_path):
    opened(monkeypatch, {"format": "something-else"})
    with pytest.raises(PipelineError) as caught:
        generation.load_translator(tmp_path / "m.onnx")
    assert str(caught.value) == (f"{tmp_path / 'm.onnx'} is not a translation model written by "
                                 f"src.export (metadata format 'something-else', expected "
                                 f"{GRAPH_FORMAT} or {TEXT_FORMAT})")


@pytest.mark.parametrize("retired", RETIRED_FORMATS)
def test_a_file_of_an_older_format_is_refused_saying_to_export_it_again(monkeypatch, tmp_path,
                                                                        retired):
    opened(monkeypatch, {**META, "format": retired})
    with pytest.raises(PipelineError) as caught:
        generation.load_translator(tmp_path / "m.onnx")
    assert str(caught.value) == (
        f"{tmp_path / 'm.onnx'} was written by an older version of the export (format "
        f"{retired}; this version reads {GRAPH_FORMAT} and {TEXT_FORMAT}): export it again "
        f"with python -m src.export (dvc repro export)")


def test_a_text_model_opens_without_a_tokenizer_and_refuses_one(monkeypatch, tmp_path):
    opened(monkeypatch, dict(TEXT_META))
    model = generation.load_translator(tmp_path / "m.onnx")
    assert isinstance(model, generation.TextTranslator) and model.open_batch is not None
    with pytest.raises(PipelineError) as caught:
        generation.load_translator(tmp_path / "m.onnx", tokenizer_dir=tmp_path)
    assert str(caught.value) == (f"{tmp_path / 'm.onnx'} is a text model with its tokenizer "
                                 f"inside; drop --tokenizer")


def test_on_cuda_batches_keep_the_files_own_session(monkeypatch, tmp_path):
    opened(monkeypatch, dict(TEXT_META), provider="CUDAExecutionProvider")
    assert generation.load_translator(tmp_path / "m.onnx").open_batch is None


def test_a_generation_model_needs_its_own_tokenizer(monkeypatch, tmp_path):
    opened(monkeypatch, dict(META))
    with pytest.raises(PipelineError) as caught:
        generation.load_translator(tmp_path / "m.onnx")
    assert str(caught.value) == (f"tokenizer not found: {tmp_path / 'tokenizer/source.model'} "
                                 f"(pass --tokenizer DIR)")
    tok = tmp_path / "tokenizer"
    tok.mkdir()
    for side in ("source", "target"):
        (tok / f"{side}.model").write_bytes(b"x")
    with pytest.raises(PipelineError) as caught:
        generation.load_translator(tmp_path / "m.onnx")
    assert str(caught.value) == (f"tokenizer {tok / 'source.model'} does not match the model "
                                 f"(its sha256 differs from the one recorded at export): use "
                                 f"the tokenizer exported with m.onnx")


# -- what the survivors of mutation testing showed untested ------------------------------------

class Words(Chars):
    """One id per word: token counts and character counts order lines differently."""

    def encode(self, text: str) -> list[int]:
        return [100 + len(word) for word in text.split()]


def test_a_batch_search_gets_the_files_length_penalty_pad_and_eos():
    session = Session(echo_search)
    model = translator(meta={"length_penalty": "0.6", "max_output_tokens": "30"},
                       session=session)
    assert model.translate(["ab", "cde"], batch_size=8) == ["ba", "edc"]  # UNK, PAD dropped
    names, feeds = session.calls[0]
    assert feeds["length_penalty"] == [pytest.approx(0.6)]
    assert feeds["input_ids"] == [[97, 98, EOS, PAD], [99, 100, 101, EOS]]
    found = model.translate_scored(["ab", "cde"], batch_size=8, max_length=3)
    assert [hyps[0].text for hyps in found] == ["ba", "ed"]  # UNK + 2 of 3 allowed
    names, feeds = session.calls[-1]
    assert feeds["length_penalty"] == [pytest.approx(0.6)] and feeds["max_length"] == [4]


def test_run_scored_returns_one_hypothesis_by_default():
    found = translator().run_scored([[97, 98, EOS]], beam=4, max_length=None)
    assert len(found) == 1 and [s.text for s in found[0]] == ["ba"]
    model, session = text_model()
    assert [s.text for s in model.run_scored(["ab"])[0]] == ["AB"]
    assert session.calls[-1][1]["num_return_sequences"] == [1]


def test_a_batchs_n_best_lists_go_to_the_batch_session_and_one_sentences_to_its_own():
    own, batch = Session(echo_search), Session(echo_search)
    model = translator(meta={"max_output_tokens": "30"}, session=own, batch=batch)
    model.translate_scored(["ab", "cd"], n_best=2, batch_size=8)
    assert len(batch.calls) == 1 and not own.calls
    model.translate_scored(["ab"], n_best=2)
    assert len(own.calls) == 1 and len(batch.calls) == 1
    text, text_session = text_model()
    text_batch = Session(text_reply)
    text.open_batch = lambda: text_batch
    text.translate_scored(["ab", "cd"], n_best=2, batch_size=8)
    assert not text_session.calls and len(text_batch.calls) == 1


def test_default_batches_hold_32_lines():
    session = Session(echo_search)
    model = translator(meta={"max_output_tokens": "30"}, session=session)
    model.translate([f"l{i:02}" for i in range(40)])
    model.translate_scored([f"l{i:02}" for i in range(40)])
    assert [len(feeds["input_ids"]) for _, feeds in session.calls] == [32, 8, 32, 8]
    text, text_session = text_model()
    text.translate([f"l{i:02}" for i in range(40)])
    text.translate_scored([f"l{i:02}" for i in range(40)])
    assert [len(feeds["text"]) for _, feeds in text_session.calls] == [32, 8, 32, 8]


def test_batches_are_sorted_by_source_tokens_not_characters():
    session = Session(echo_search)
    model = generation.Translator(session, META | {"max_output_tokens": "30"}, Words(),
                                  Chars(), warn=lambda m: None)
    lines = ["a b c d", "abcdefghijkl"]  # 4 tokens in 7 characters, 1 token in 12
    model.translate(lines, batch_size=1)
    model.translate_scored(lines, batch_size=1)
    firsts = [feeds["input_ids"][0][0] for _, feeds in session.calls]
    assert firsts == [112, 101, 112, 101]  # the one-token line first
    text, text_session = text_model()
    text.__dict__["source"] = Words()
    text.translate(lines, batch_size=1)
    text.translate_scored(lines, batch_size=1)
    assert [feeds["text"][0] for _, feeds in text_session.calls] == [lines[1], lines[0]] * 2


def test_warnings_name_the_line_from_the_first_line_number():
    warnings = []
    model = translator(warn=warnings.append, meta={"max_output_tokens": "30"})
    model.translate(["ab", "abcdefgh"])
    model.translate_scored(["abcdefgh", "ab"], first_line_no=10)
    model.translate_scored(["abcdefgh"])
    assert [w.split(":")[0] for w in warnings] == ["line 2", "line 10", "line 1"]


def test_a_text_model_is_fed_object_strings_and_int32_settings():
    model, session = text_model()
    model.translate(["ab", "cd"], beam=3)
    assert session.dtypes["text"].kind == "O" and session.dtypes["num_beams"] == np.int32
    model.translate_scored(["ab", "cd"], beam=3, n_best=2)
    assert session.dtypes["text"].kind == "O" and session.calls[-1][1]["num_beams"] == [3]


def test_a_text_models_refusals_apply_to_n_best_lists_too():
    with pytest.raises(PipelineError, match="searches as exported"):
        text_model()[0].translate_scored(["ab"], max_length=4)
    with pytest.raises(PipelineError) as caught:
        text_model()[0].translate_scored(["ab"], beam=2, n_best=3)
    assert str(caught.value).startswith("n-best 3: a search with beam 2 returns 1 to 2")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from toy_corpus import toy_pairs

    from src.data.subword import train_spm

    folder = tmp_path_factory.mktemp("tokenizer")
    model = train_spm([side for pair in toy_pairs() for side in pair], vocab_size=400,
                      model_type="unigram", character_coverage=1.0, byte_fallback=True, seed=0)
    (folder / "source.model").write_bytes(model)
    (folder / "target.model").write_bytes(model[:-1] + model[-1:])
    return folder


def test_a_generation_model_opens_with_the_tokenizer_its_export_recorded(monkeypatch, tmp_path,
                                                                         tokenizer_dir):
    from src.runtime.sessions import DEFAULT_THREADS, tokenizer_metadata

    session = Session(echo_search)
    session.get_modelmeta = lambda: SimpleNamespace(
        custom_metadata_map=META | tokenizer_metadata(tokenizer_dir))
    asked = []
    monkeypatch.setattr(generation, "open_operator_session",
                        lambda *args: asked.append(("operator", *args)) and None)
    monkeypatch.setattr(generation, "open_session",
                        lambda *args: asked.append(("plain", *args)) or session)
    monkeypatch.setattr(generation, "open_batch_session",
                        lambda *args: asked.append(("batch", *args)) or "batch session")
    path, warn = tmp_path / "m.onnx", print
    model = generation.load_translator(path, tokenizer_dir, provider="cpu", warn=warn)
    assert asked == [("operator", path, "cpu", DEFAULT_THREADS, warn),
                     ("plain", path, "cpu", DEFAULT_THREADS, warn)]
    assert isinstance(model, generation.Translator) and model.session is session
    assert model.meta["eos_id"] == str(EOS) and model.warn is warn
    assert model.source.encode("hello") == model.target.encode("hello") != []
    assert model.batch_session == "batch session"
    assert asked[-1] == ("batch", path, "cpu", DEFAULT_THREADS, warn)
    generation.load_translator(path, tokenizer_dir, threads=3)
    assert asked[-2][1:] == (path, "auto", 3, generation.warn_stderr)


def test_the_operator_session_is_used_when_the_file_has_one(monkeypatch, tmp_path):
    operator = Session(text_reply)
    operator.get_modelmeta = lambda: SimpleNamespace(custom_metadata_map=dict(TEXT_META))
    monkeypatch.setattr(generation, "open_operator_session", lambda *args: operator)
    monkeypatch.setattr(generation, "open_session", lambda *args: pytest.fail("not needed"))
    model = generation.load_translator(tmp_path / "m.onnx")
    assert model.session is operator and model.meta == TEXT_META


def test_a_tokenizer_side_that_does_not_match_is_named(tmp_path, tokenizer_dir):
    from src.runtime.sessions import tokenizer_metadata

    meta = tokenizer_metadata(tokenizer_dir)
    source, target = generation.load_tokenizers_for(tmp_path / "m.onnx", tokenizer_dir, meta)
    assert source.encode("hello") == target.encode("hello")
    wrong = meta | {"target_tokenizer_sha256": "0" * 64}
    with pytest.raises(PipelineError) as caught:
        generation.load_tokenizers_for(tmp_path / "m.onnx", tokenizer_dir, wrong)
    assert str(caught.value).startswith(f"tokenizer {tokenizer_dir / 'target.model'} does not "
                                        f"match the model")
