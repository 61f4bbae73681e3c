"""The MLflow model: a pyfunc that takes sentences and returns translations, running the
exported ONNX graph through src/runtime/generation.py (no torch at serving time).

    model = mlflow.pyfunc.load_model("models:/nmt-en-zh@candidate")
    model.predict(["How are you?"], params={"beam": 4})
    mlflow models serve -m models:/nmt-en-zh@candidate --env-manager local

`export` logs it with model.onnx, model.int8.onnx and the SentencePiece models as artifacts, a
signature from predict's type hints whose params are `beam` and `max_length` (0: the export's
defaults), `n_best` (1) and `return_scores` (false), and requirements without torch; it
registers a new version of `nmt-<src>-<tgt>` and points the alias `candidate` at it.

With the default params a request gets a list of strings, as always. With `return_scores` or
`n_best` > 1 each sentence gets an object instead: `translation`, with `return_scores` its
`score` and `confidence` (src/runtime/confidence.py), with `n_best` > 1 its `hypotheses`
(`translation` and, with scores, `score` each, best first). docs/serving.md shows both.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow.pyfunc

from src.core.errors import PipelineError
from src.core.paths import text_twin
from src.runtime import placement
from src.runtime.contract import MAX_BEAM
from src.runtime.generation import load_translator

CANDIDATE = "candidate"
MAX_CHARS = 5_000  # per sentence: the model reads at most a few hundred tokens of it anyway
MAX_SENTENCES = 10_000  # per request; larger batches belong in spark_udf or a loop
EXAMPLE = ["How are you?"]
# The files of src/ the served model imports (mlflow_model.py and all it pulls in), relative to
# src/: MLflow copies them into the model, which then loads with its requirements alone (no
# typer, torch or dvc). tests/test_serving.py checks the list against the imports.
MODEL_CODE = ("__init__.py", "core/__init__.py", "core/cpus.py", "core/errors.py",
              "core/paths.py", "core/special_ids.py",
              "data/__init__.py", "data/subword.py", "runtime/__init__.py",
              "runtime/batch_graph.py", "runtime/confidence.py", "runtime/contract.py",
              "runtime/generation.py", "runtime/length_batches.py", "runtime/mlflow_model.py",
              "runtime/operator_graph.py", "runtime/placement.py", "runtime/proto_wire.py",
              "runtime/serving.py", "runtime/sessions.py")


def bad_request(message: str):
    """An error `mlflow models serve` answers with HTTP 400 and this message."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def as_sentences(model_input) -> list[str]:
    """A list, a pandas Series or the first column of a DataFrame, as a list of strings."""
    import numpy as np
    import pandas as pd

    if isinstance(model_input, pd.DataFrame):
        if model_input.shape[1] != 1:
            raise bad_request(f"expected one column of sentences, got {model_input.shape[1]}")
        model_input = model_input.iloc[:, 0]
    if isinstance(model_input, (pd.Series, np.ndarray)):
        model_input = model_input.tolist()
    if isinstance(model_input, str):
        model_input = [model_input]
    if not isinstance(model_input, list):
        raise bad_request(f"expected a list of sentences, got {type(model_input).__name__}")
    if not model_input:
        raise bad_request("no sentences to translate: send a non-empty list of strings")
    if len(model_input) > MAX_SENTENCES:
        raise bad_request(f"{len(model_input):,} sentences in one request; the limit is "
                          f"{MAX_SENTENCES:,}")
    for i, sentence in enumerate(model_input):
        if not isinstance(sentence, str):
            raise bad_request(f"input {i} is a {type(sentence).__name__}, not a string")
        if len(sentence) > MAX_CHARS:
            raise bad_request(f"input {i} has {len(sentence):,} characters; the limit is "
                              f"{MAX_CHARS:,} (split long text into sentences)")
    return model_input


@dataclass(frozen=True)
class Request:
    """The params of one request, checked."""

    beam: int | None  # None: the export's
    max_length: int | None
    n_best: int
    return_scores: bool

    @property
    def rich(self) -> bool:
        """Objects instead of strings."""
        return self.return_scores or self.n_best > 1


def search_params(params: dict | None, default_beam: int) -> Request:
    """`beam` and `max_length` (0 or absent: the export's defaults), `n_best` (absent: 1; at
    most the beam) and `return_scores` (absent: false) from the request."""
    params = params or {}
    if not isinstance(params, dict):
        raise bad_request(f"params must be an object of search settings, not a "
                          f"{type(params).__name__}")
    values = {}
    for name, low, top in (("beam", 0, MAX_BEAM), ("max_length", 0, 1_000),
                           ("n_best", 1, MAX_BEAM)):
        value = params.get(name, 1 if name == "n_best" else 0)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
            raise bad_request(f"param {name} must be a whole number from {low} to {top}, "
                              f"not {value!r}")
        values[name] = value
    return_scores = params.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise bad_request(f"param return_scores must be true or false, not {return_scores!r}")
    beam = values["beam"] or default_beam
    if values["n_best"] > beam:
        raise bad_request(f"param n_best {values['n_best']} is more than the beam {beam}: a "
                          f"search returns at most as many hypotheses as its beam (raise beam)")
    return Request(values["beam"] or None, values["max_length"] or None, values["n_best"],
                   return_scores)


THREADS_VARIABLE = "NMT_THREADS"  # ONNX Runtime threads per request of a served model
# One thread per request: the server runs concurrent requests side by side (MLflow's scoring
# server calls predict in a thread pool), and under 4 and 16 clients that beat two threads per
# request on 2 cores; a lone client with large batches is faster with two (docs/serving.md).
SERVING_THREADS = 1


def serving_threads(environ: dict[str, str]) -> tuple[int, str]:
    """ONNX Runtime threads of the served model, and why: NMT_THREADS when set, else
    SERVING_THREADS."""
    text = environ.get(THREADS_VARIABLE, "").strip()
    if not text:
        return SERVING_THREADS, f"the serving default ({THREADS_VARIABLE} unset)"
    if not (text.isdigit() and int(text) >= 1):
        raise PipelineError(f"{THREADS_VARIABLE}={text!r}: expected a whole number of at "
                            f"least 1 (ONNX Runtime threads per request)")
    return int(text), f"{THREADS_VARIABLE}={text}"


PROVIDER_VARIABLE = "NMT_PROVIDER"  # auto (unset), cuda or cpu: where the served model runs


def serving_provider(environ: dict[str, str]) -> tuple[str, str]:
    """The provider choice of the served model (src/runtime/placement.py), and why:
    NMT_PROVIDER when set (cpu: a GPU machine that serves from its CPU), else auto."""
    text = environ.get(PROVIDER_VARIABLE, "").strip()
    if not text:
        return "auto", f"{PROVIDER_VARIABLE} unset"
    if text not in placement.CHOICES:
        raise PipelineError(f"{PROVIDER_VARIABLE}={text!r}: expected one of "
                            f"{', '.join(placement.CHOICES)}")
    return text, f"{PROVIDER_VARIABLE}={text}"


class TranslationModel(mlflow.pyfunc.PythonModel):
    """Sentences in, translations out (one per input, in order)."""

    def load_context(self, context) -> None:
        import logging

        log = logging.getLogger("nmt.serving")
        if not log.handlers and not logging.getLogger().handlers:
            # MLflow's scoring server leaves logging unconfigured, which shows warnings alone:
            # the line below, where the model runs, belongs in the server's log too
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
        threads, why = serving_threads(dict(os.environ))
        provider, why_provider = serving_provider(dict(os.environ))
        self.translator = load_translator(
            Path(context.artifacts["model"]), Path(context.artifacts["tokenizer"]),
            provider=provider, threads=threads, warn=log.warning)
        log.info("nmt: %s (%s); %d ONNX Runtime thread(s): %s", self.translator.ran_on,
                 why_provider, threads, why)

    # The type hints are the signature: MLflow checks requests against them strictly (a number
    # or a null is a 400, not the string "42"), where a column schema would convert them.
    def predict(self, context, model_input: list[str], params: dict[str, Any] | None = None
                ) -> list[str | dict[str, Any]]:
        sentences = as_sentences(model_input)
        request = search_params(params, self.translator.default_beam)
        if not request.rich:
            return self.translator.translate(sentences, request.beam, request.max_length,
                                             batch_size=32)
        found = self.translator.translate_scored(sentences, request.beam, request.max_length,
                                                 batch_size=32, n_best=request.n_best)
        return [answer(hyps, request, self.translator) for hyps in found]


def answer(hyps: tuple, request: Request, translator) -> dict[str, Any]:
    """One sentence's object: its translation, score and confidence (with return_scores), its
    hypotheses (with n_best > 1). A blank sentence has an empty translation and no score."""
    best = hyps[0] if hyps else None
    out: dict[str, Any] = {"translation": best.text if best else ""}
    if request.return_scores:
        out["score"] = best.score if best else None
        out["confidence"] = translator.confidence(best) if best else None
    if request.n_best > 1:
        out["hypotheses"] = [{"translation": h.text, **({"score": h.score}
                                                         if request.return_scores else {})}
                             for h in hyps]
    return out


def requirements(text_models: bool = False) -> list[str]:
    """What the model needs to run: the installed ONNX Runtime build, sentencepiece, numpy,
    pandas, and onnxruntime-extensions when the text models are in it; never torch."""
    names = ["onnxruntime-gpu", "onnxruntime", "sentencepiece", "numpy", "pandas"]
    if text_models:
        names.append("onnxruntime-extensions")
    installed = {}
    for name in names:
        try:
            installed[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    if "onnxruntime-gpu" in installed:
        installed.pop("onnxruntime", None)  # the GPU build provides the module; both conflict
    return [f"{name}=={version}" for name, version in installed.items()]


@contextmanager
def model_code() -> Iterator[Path]:
    """A `src` folder holding only MODEL_CODE, for MLflow's `code_paths`."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="nmt-model-code-") as tmp:
        for rel in MODEL_CODE:
            target = Path(tmp, "src", rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, target)
        yield Path(tmp, "src")


class _WantedUnion(logging.Filter):
    """predict answers one string per sentence, or one object per sentence where the request
    asks for scores or n-best lists: a union of the two, which MLflow's signature cannot check
    and says so in a warning at every export. We check requests ourselves (`search_params`):
    the warning tells a user nothing, so it is dropped, and only it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Union type hint is inferred as AnyType")


@contextmanager
def union_warning_dropped() -> Iterator[None]:
    logger = logging.getLogger("mlflow.types.type_hints")
    dropped = _WantedUnion()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def log_model(onnx_path: Path, int8_path: Path | None, tokenizer_dir: Path,
              registered_name: str, fp16_path: Path | None = None) -> str:
    """Log the pyfunc into the active run, register it, point `candidate` at the new version;
    returns the version."""
    from mlflow import MlflowClient

    artifacts = {"model": str(onnx_path), "tokenizer": str(tokenizer_dir)}
    # the other precisions ride along for clients of the registry (predict runs model.onnx)
    for key, path in (("model_int8", int8_path), ("model_fp16", fp16_path)):
        if path is not None and path.exists():
            artifacts[key] = str(path)
    # the one-file text models, for clients that download the registered version and run it
    # outside Python (predict itself runs model.onnx: it takes `beam` and `max_length`)
    for key, path in (("model_text", onnx_path), ("model_int8_text", int8_path)):
        if path is not None and text_twin(path).exists():
            artifacts[key] = str(text_twin(path))
    text_models = any(key.endswith("_text") for key in artifacts)
    with model_code() as code, union_warning_dropped():
        info = mlflow.pyfunc.log_model(
            name="translator",
            python_model=str(Path(__file__).with_name("mlflow_model.py")),
            artifacts=artifacts,
            # (input, params): the signature's params and their defaults (beam, max_length 0:
            # the export's)
            input_example=(EXAMPLE, {"beam": 0, "max_length": 0, "n_best": 1,
                                     "return_scores": False}),
            pip_requirements=requirements(text_models),
            code_paths=[str(code)],
            registered_model_name=registered_name,
        )
    version = str(info.registered_model_version)
    MlflowClient().set_registered_model_alias(registered_name, CANDIDATE, version)
    return version
