"""Every path the pipeline reads or writes, derived from the repository root (CCDS style).

Stages take these as CLI defaults so `dvc.yaml` and the code name the same files.
"""

from __future__ import annotations

import os
from pathlib import Path

# NMT_ROOT lets tests run the stages against a temporary copy of the repo.
ROOT = Path(os.environ.get("NMT_ROOT", Path(__file__).resolve().parents[2]))
PARAMS = ROOT / "params.yaml"
DATA = ROOT / "data"
MODELS = ROOT / "models"

RAW = DATA / "raw"
RAW_CORPUS = RAW / "corpus.tsv"
RAW_TEST = RAW / "test.tsv"  # a predefined test set; absent when split carves one out
RAW_TEST_SETS = RAW / "testsets"  # <name>.tsv per named test set (download.test_sets)
RAW_META = DATA / "download.json"  # beside data/raw, the DVC output it describes

SPLIT = DATA / "split"
NAMED_TEST_SPLIT = "test_{}"  # the split holding named test set {name} (download.test_sets)
SPLIT_STATS = DATA / "split_stats.json"

PARENT = MODELS / "parent"  # train.init_from resolved: parent.json (+ model.pt, tokenizer/)

TOKENIZED = DATA / "tokenized"
TOKENIZER = MODELS / "tokenizer"
TOKENIZE_STATS = DATA / "tokenize_stats.json"

CHECKPOINTS = MODELS / "checkpoints"
TRAIN_METRICS = MODELS / "train_metrics.json"  # headline (DVC metrics)
TRAIN_STATS = MODELS / "train_stats.json"  # everything
TRAIN_CURVE = MODELS / "train_curve.csv"
VALID_CURVE = MODELS / "valid_curve.csv"

EVAL = DATA / "eval"
EVAL_METRICS = EVAL / "metrics.json"
EVAL_STATS = EVAL / "stats.json"
EVAL_TRANSLATIONS = EVAL / "translations.tsv"
EVAL_RISK_COVERAGE = EVAL / "risk_coverage.csv"  # translations kept vs their mean chrF

ONNX_MODEL = MODELS / "model.onnx"
EXPORT_METRICS = MODELS / "export_metrics.json"
EXPORT_STATS = MODELS / "export_stats.json"
ONNX_INT8_MODEL = MODELS / "model.int8.onnx"
ONNX_FP16_MODEL = MODELS / "model.fp16.onnx"  # for GPUs: ONNX Runtime runs it on CUDA only
ONNX_SCORE_MODEL = MODELS / "model.score.onnx"  # teacher-forced log-probabilities (src.score)


def text_twin(generation_model: Path) -> Path:
    """Where export writes the text-in, text-out twin: model.onnx -> model.text.onnx."""
    return generation_model.with_name(generation_model.name.removesuffix(".onnx") + ".text.onnx")
