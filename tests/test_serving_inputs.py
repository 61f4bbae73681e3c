"""The served model's request checks (src/runtime/serving.py), without a model: what is accepted
becomes a list of sentences and search settings; what is not is an MLflow 400 naming why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from src.runtime.contract import MAX_BEAM
from src.runtime.serving import (
    MAX_CHARS,
    MAX_SENTENCES,
    Request,
    as_sentences,
    search_params,
)


def refused(call, fragment: str) -> None:
    with pytest.raises(MlflowException, match=fragment) as info:
        call()
    assert info.value.get_http_status_code() == 400


@pytest.mark.parametrize("given", [
    ["a", "b"], pd.Series(["a", "b"]), pd.DataFrame({"text": ["a", "b"]}), np.array(["a", "b"])])
def test_lists_series_frames_and_arrays_become_a_list_of_sentences(given):
    assert as_sentences(given) == ["a", "b"]


def test_one_string_is_one_sentence():
    assert as_sentences("Hello.") == ["Hello."]


def test_requests_the_model_cannot_take_are_400s_that_say_why():
    refused(lambda: as_sentences([]),
            "^no sentences to translate: send a non-empty list of strings$")
    refused(lambda: as_sentences(pd.DataFrame({"a": ["x"], "b": ["y"]})), "one column")
    refused(lambda: as_sentences({"text": "x"}), "expected a list of sentences, got dict")
    refused(lambda: as_sentences(["ok", 42]), "input 1 is a int, not a string")
    refused(lambda: as_sentences(["x" * (MAX_CHARS + 1)]), f"input 0 has {MAX_CHARS + 1:,}")
    as_sentences(["x" * MAX_CHARS])  # the limit itself is fine


def test_a_request_of_more_sentences_than_the_limit_is_refused():
    as_sentences(["x"] * MAX_SENTENCES)
    refused(lambda: as_sentences(["x"] * (MAX_SENTENCES + 1)),
            f"{MAX_SENTENCES + 1:,} sentences in one request; the limit is {MAX_SENTENCES:,}")


def test_search_params_default_to_the_exports_and_check_their_range():
    plain = Request(None, None, 1, False)
    assert search_params(None, 4) == plain
    assert search_params({"beam": 0, "max_length": 0}, 4) == plain
    assert search_params({"beam": 4, "max_length": 50}, 4) == Request(4, 50, 1, False)
    assert search_params({"beam": MAX_BEAM, "max_length": 1000}, 4) == \
        Request(MAX_BEAM, 1000, 1, False)
    assert search_params({"n_best": 3, "return_scores": True}, 4) == Request(None, None, 3, True)
    for bad in ({"beam": MAX_BEAM + 1}, {"beam": -1}, {"beam": 2.5}, {"beam": "4"},
                {"max_length": 1001}, {"n_best": 0}, {"n_best": True}):
        name = next(iter(bad))
        refused(lambda bad=bad: search_params(bad, 4), f"param {name} must be a whole number")
    refused(lambda: search_params({"return_scores": "yes"}, 4),
            "param return_scores must be true or false")


def test_more_hypotheses_than_the_beam_is_a_bad_request_with_the_reason():
    refused(lambda: search_params({"n_best": 5}, 4), "param n_best 5 is more than the beam 4")
    refused(lambda: search_params({"n_best": 3, "beam": 2}, 4),
            "param n_best 3 is more than the beam 2")
    assert search_params({"n_best": 6, "beam": 6}, 4).n_best == 6


class FakeTranslator:
    """Upper-cases each sentence; its n-best list adds lower-cased, worse-scored ones."""

    default_beam = 4

    def __init__(self):
        self.calls = []

    def translate(self, sentences, beam, max_length, batch_size):
        self.calls.append((sentences, beam, max_length, batch_size))
        return [s.upper() for s in sentences]

    def translate_scored(self, sentences, beam, max_length, batch_size, n_best):
        from src.runtime.generation import Scored

        self.calls.append((sentences, beam, max_length, batch_size, n_best))
        return [tuple(Scored(s.upper() if k == 0 else s + str(k), -0.5 * (k + 1), 2)
                      for k in range(n_best)) if s else () for s in sentences]

    def confidence(self, best):
        return 0.25


def test_predict_checks_the_request_and_hands_the_translator_its_settings():
    from src.runtime.serving import TranslationModel

    model = TranslationModel()
    model.translator = FakeTranslator()
    calls = model.translator.calls
    assert model.predict(None, ["a", "b"], {"beam": 2}) == ["A", "B"]
    assert model.predict(None, ["c"]) == ["C"]
    assert model.predict(None, ["d"], {"max_length": 40}) == ["D"]
    assert calls == [(["a", "b"], 2, None, 32), (["c"], None, None, 32), (["d"], None, 40, 32)]
    refused(lambda: model.predict(None, []), "no sentences")


def test_scores_and_n_best_lists_come_as_objects_only_when_asked_for():
    from src.runtime.serving import TranslationModel

    model = TranslationModel()
    model.translator = FakeTranslator()
    assert model.predict(None, ["a"], {"return_scores": True}) == [
        {"translation": "A", "score": -0.5, "confidence": 0.25}]
    assert model.predict(None, ["a", ""], {"n_best": 2}) == [
        {"translation": "A", "hypotheses": [{"translation": "A"}, {"translation": "a1"}]},
        {"translation": "", "hypotheses": []}]
    both = model.predict(None, ["b"], {"n_best": 2, "return_scores": True})[0]
    assert both["hypotheses"] == [{"translation": "B", "score": -0.5},
                                  {"translation": "b1", "score": -1.0}]


@pytest.mark.parametrize("environ, threads", [
    ({}, 1), ({"NMT_THREADS": ""}, 1), ({"NMT_THREADS": "2"}, 2), ({"NMT_THREADS": " 4 "}, 4)])
def test_the_served_model_opens_its_session_with_the_threads_asked_for(monkeypatch, environ,
                                                                        threads):
    from types import SimpleNamespace

    from src.runtime import serving

    opened = []

    def load_translator(model, tokenizer, provider, threads, warn):
        opened.append((model, tokenizer, threads))
        return SimpleNamespace(ran_on="CPUExecutionProvider")

    monkeypatch.setattr(serving, "load_translator", load_translator)
    monkeypatch.delenv("NMT_THREADS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    context = SimpleNamespace(artifacts={"model": "m.onnx", "tokenizer": "tok"})
    serving.TranslationModel().load_context(context)
    assert opened == [(Path("m.onnx"), Path("tok"), threads)]


@pytest.mark.parametrize("environ, provider", [
    ({}, "auto"), ({"NMT_PROVIDER": ""}, "auto"), ({"NMT_PROVIDER": "cpu"}, "cpu"),
    ({"NMT_PROVIDER": " cuda "}, "cuda")])
def test_the_served_model_runs_where_nmt_provider_says(monkeypatch, environ, provider):
    """A GPU machine can serve from its CPU (NMT_PROVIDER=cpu), or insist on CUDA."""
    from types import SimpleNamespace

    from src.runtime import serving

    asked = []

    def load_translator(model, tokenizer, provider, threads, warn):
        asked.append(provider)
        return SimpleNamespace(ran_on="CPUExecutionProvider")

    monkeypatch.setattr(serving, "load_translator", load_translator)
    monkeypatch.delenv("NMT_PROVIDER", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    serving.TranslationModel().load_context(
        SimpleNamespace(artifacts={"model": "m.onnx", "tokenizer": "tok"}))
    assert asked == [provider]


def test_an_unknown_provider_for_the_served_model_is_refused():
    from src.core.errors import PipelineError
    from src.runtime.serving import serving_provider

    with pytest.raises(PipelineError, match="NMT_PROVIDER='gpu': expected one of auto, cuda, "
                                            "cpu$"):
        serving_provider({"NMT_PROVIDER": "gpu"})


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_thread_count_that_is_not_a_whole_number_above_zero_is_refused(value):
    from src.core.errors import PipelineError
    from src.runtime.serving import serving_threads

    with pytest.raises(PipelineError, match=f"NMT_THREADS='{value}'"):
        serving_threads({"NMT_THREADS": value})


def test_the_model_declares_its_runtime_and_never_torch():
    from importlib.metadata import version

    from src.runtime.serving import requirements

    plain, text = requirements(), requirements(text_models=True)
    names = [r.split("==")[0] for r in plain]
    assert "torch" not in names and {"sentencepiece", "numpy", "pandas"} <= set(names)
    assert sum(n in {"onnxruntime", "onnxruntime-gpu"} for n in names) == 1  # never both
    assert f"sentencepiece=={version('sentencepiece')}" in plain
    assert text == plain + [f"onnxruntime-extensions=={version('onnxruntime-extensions')}"]


def test_the_model_code_folder_holds_exactly_model_code():
    from src.runtime.serving import MODEL_CODE, model_code

    with model_code() as folder:
        assert folder.name == "src"
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if p.is_file())
        assert files == sorted(MODEL_CODE)
        assert (folder / "runtime/serving.py").read_text() == \
            (Path(__file__).resolve().parents[1] / "src/runtime/serving.py").read_text()
    assert not folder.exists()  # a temporary folder, removed after logging


def test_params_that_are_not_an_object_say_what_they_are():
    refused(lambda: search_params(True, 4), "params must be an object of search settings, "
                                            "not a bool$")
    refused(lambda: search_params([1], 4), "not a list$")


def test_one_thread_is_a_thread_count():
    from src.runtime.serving import serving_threads

    assert serving_threads({"NMT_THREADS": "1"}) == (1, "NMT_THREADS=1")


def test_rich_requests_hand_the_translator_their_settings_and_blank_lines_score_nothing():
    from src.runtime.serving import TranslationModel

    class Recording(FakeTranslator):
        def confidence(self, best):
            self.calls.append(("confidence", best.text))
            return 0.75

    model = TranslationModel()
    model.translator = Recording()
    got = model.predict(None, ["a", ""], {"beam": 2, "max_length": 40, "return_scores": True})
    assert got == [{"translation": "A", "score": -0.5, "confidence": 0.75},
                   {"translation": "", "score": None, "confidence": None}]
    assert model.translator.calls == [(["a", ""], 2, 40, 32, 1), ("confidence", "A")]
