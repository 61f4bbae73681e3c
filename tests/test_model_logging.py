"""What export hands MLflow when it logs the served model (artifacts, code, requirements, the
registered version's alias), and what the served model opens when MLflow loads it. MLflow
itself is replaced by recorders here; tests/test_serving.py logs, loads and serves for real
(slow)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest

from src.runtime import serving

REPO = Path(__file__).resolve().parent.parent


class Recorder:
    """Stands in for mlflow.pyfunc.log_model and MlflowClient; keeps what they were given,
    including the files of the model-code folder while it exists."""

    def __init__(self, version: int = 7):
        self.version, self.logged, self.aliases, self.code_files = version, None, [], None

    def log_model(self, **kwargs):
        self.logged = kwargs
        (folder,) = kwargs["code_paths"]
        self.code_files = sorted(p.relative_to(folder).as_posix()
                                 for p in Path(folder).rglob("*") if p.is_file())
        return SimpleNamespace(registered_model_version=self.version)

    def client(self):
        recorder = self

        class Client:
            def set_registered_model_alias(self, name, alias, version):
                recorder.aliases.append((name, alias, version))

        return Client()


@pytest.fixture
def recorder(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(mlflow.pyfunc, "log_model", recorder.log_model)
    monkeypatch.setattr(mlflow, "MlflowClient", recorder.client)
    return recorder


def export_dir(tmp_path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).write_bytes(b"onnx")
    (tmp_path / "tokenizer").mkdir(exist_ok=True)
    return tmp_path


def test_every_exported_file_is_logged_and_the_new_version_becomes_the_candidate(tmp_path,
                                                                                  recorder):
    d = export_dir(tmp_path, "model.onnx", "model.int8.onnx", "model.text.onnx",
                   "model.int8.text.onnx", "model.fp16.onnx")
    version = serving.log_model(d / "model.onnx", d / "model.int8.onnx", d / "tokenizer",
                                "nmt-en-zh", d / "model.fp16.onnx")
    assert version == "7"
    assert recorder.aliases == [("nmt-en-zh", "candidate", "7")]
    logged = recorder.logged
    assert logged["artifacts"] == {
        "model": str(d / "model.onnx"), "tokenizer": str(d / "tokenizer"),
        "model_int8": str(d / "model.int8.onnx"), "model_text": str(d / "model.text.onnx"),
        "model_int8_text": str(d / "model.int8.text.onnx"),
        "model_fp16": str(d / "model.fp16.onnx")}
    assert logged["pip_requirements"] == serving.requirements(text_models=True)
    assert logged["registered_model_name"] == "nmt-en-zh"
    assert logged["name"] == "translator"
    # built from code (nothing pickled): the file that calls set_model, and the code it imports
    assert logged["python_model"] == str(REPO / "src/runtime/mlflow_model.py")
    assert recorder.code_files == sorted(serving.MODEL_CODE)
    # the input example carries the signature's params and their defaults (0: the export's)
    assert logged["input_example"] == (["How are you?"], {"beam": 0, "max_length": 0,
                                                          "n_best": 1, "return_scores": False})


def test_logging_drops_mlflows_union_warning_and_only_it(tmp_path, recorder, monkeypatch, caplog):
    """MLflow warns at every export that predict's output (a string, or an object) is a union
    it cannot check; a user reading the repro's log can do nothing about it. Other warnings
    from the same logger still come through."""
    from typing import Any

    from mlflow.types import type_hints

    def log_model(**kwargs):
        type_hints._infer_schema_from_list_type_hint(list[str | dict[str, Any]])  # the real one
        logging.getLogger("mlflow.types.type_hints").warning("another warning")
        return recorder.log_model(**kwargs)

    monkeypatch.setattr(mlflow.pyfunc, "log_model", log_model)
    d = export_dir(tmp_path, "model.onnx")
    with caplog.at_level(logging.WARNING, logger="mlflow.types.type_hints"):
        serving.log_model(d / "model.onnx", None, d / "tokenizer", "nmt-en-zh")
    assert [r.getMessage() for r in caplog.records] == ["another warning"]
    # outside an export the filter is gone
    with caplog.at_level(logging.WARNING, logger="mlflow.types.type_hints"):
        type_hints._infer_schema_from_list_type_hint(list[str | dict[str, Any]])
    assert "Union type hint" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("int8", ["none", "missing"])
def test_absent_files_are_not_logged(tmp_path, recorder, int8):
    """Not asked for (None), or asked for but not written: int8 and fp16 alike."""
    d = export_dir(tmp_path, "model.onnx")
    missing = None if int8 == "none" else d / "model.int8.onnx"
    serving.log_model(d / "model.onnx", missing, d / "tokenizer", "nmt-en-vi",
                      None if int8 == "none" else d / "model.fp16.onnx")
    assert recorder.logged["artifacts"] == {"model": str(d / "model.onnx"),
                                            "tokenizer": str(d / "tokenizer")}
    assert recorder.logged["pip_requirements"] == serving.requirements(text_models=False)
    assert recorder.aliases == [("nmt-en-vi", "candidate", "7")]


def test_one_text_twin_is_enough_to_need_the_extensions(tmp_path, recorder):
    d = export_dir(tmp_path, "model.onnx", "model.int8.onnx", "model.int8.text.onnx")
    serving.log_model(d / "model.onnx", d / "model.int8.onnx", d / "tokenizer", "nmt-en-zh")
    assert set(recorder.logged["artifacts"]) == {"model", "tokenizer", "model_int8",
                                                 "model_int8_text"}
    assert recorder.logged["pip_requirements"] == serving.requirements(text_models=True)


def test_loading_opens_the_logged_model_and_tokenizer_and_logs_where_it_runs(monkeypatch,
                                                                            caplog):
    opened = []

    def load_translator(model, tokenizer, provider, threads, warn):
        opened.append((model, tokenizer, provider))
        warn("a warning from the runtime")
        return SimpleNamespace(ran_on="CPUExecutionProvider 152 nodes")

    monkeypatch.setattr(serving, "load_translator", load_translator)
    monkeypatch.delenv("NMT_THREADS", raising=False)
    monkeypatch.delenv("NMT_PROVIDER", raising=False)
    context = SimpleNamespace(artifacts={"model": "/m/model.onnx", "tokenizer": "/m/tokenizer",
                                         "model_int8": "/m/model.int8.onnx"})
    model = serving.TranslationModel()
    with caplog.at_level(logging.INFO, logger="nmt.serving"):
        model.load_context(context)
    assert opened == [(Path("/m/model.onnx"), Path("/m/tokenizer"), "auto")]
    assert model.translator.ran_on == "CPUExecutionProvider 152 nodes"
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("nmt.serving", "WARNING", "a warning from the runtime"),
        ("nmt.serving", "INFO", "nmt: CPUExecutionProvider 152 nodes (NMT_PROVIDER unset); 1 "
                                "ONNX Runtime thread(s): the serving default (NMT_THREADS "
                                "unset)")]


@pytest.mark.parametrize("installed, expected", [
    ({"onnxruntime": "1.2", "sentencepiece": "0.2", "numpy": "2.0", "pandas": "2.2"},
     ["onnxruntime==1.2", "sentencepiece==0.2", "numpy==2.0", "pandas==2.2"]),
    ({"onnxruntime-gpu": "1.3", "onnxruntime": "1.2", "sentencepiece": "0.2", "numpy": "2.0",
      "pandas": "2.2"},
     ["onnxruntime-gpu==1.3", "sentencepiece==0.2", "numpy==2.0", "pandas==2.2"]),
    ({"onnxruntime-gpu": "1.3", "sentencepiece": "0.2", "numpy": "2.0", "pandas": "2.2",
      "onnxruntime-extensions": "0.14", "torch": "2.13.0"},
     ["onnxruntime-gpu==1.3", "sentencepiece==0.2", "numpy==2.0", "pandas==2.2"]),
], ids=["cpu-build", "both-builds-keep-the-gpu-one", "extensions-only-for-text-models"])
def test_requirements_pin_what_is_installed_with_one_onnxruntime(monkeypatch, installed,
                                                                 expected):
    import importlib.metadata

    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert serving.requirements() == expected
    if "onnxruntime-extensions" in installed:
        assert serving.requirements(text_models=True) == \
            expected + ["onnxruntime-extensions==0.14"]
