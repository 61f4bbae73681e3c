"""Every path the pipeline reads or writes, derived from the repository root (CCDS style).

Stages take these as CLI defaults so `dvc.yaml` and the code name the same files.
"""

from __future__ import annotations

import os
from pathlib import Path

# NMT_ROOT lets tests run the stages against a temporary copy of the repo.
ROOT = Path(os.environ.get("NMT_ROOT", Path(__file__).resolve().parent.parent))
PARAMS = ROOT / "params.yaml"
DATA = ROOT / "data"
MODELS = ROOT / "models"

RAW = DATA / "raw"
RAW_CORPUS = RAW / "corpus.tsv"
RAW_TEST = RAW / "test.tsv"  # a predefined test set; empty when split carves one out
RAW_META = RAW / "download.json"

SPLIT = DATA / "split"
SPLIT_METRICS = DATA / "split_metrics.json"

TOKENIZED = DATA / "tokenized"
TOKENIZER = MODELS / "tokenizer"
TOKENIZE_METRICS = DATA / "tokenize_metrics.json"

CHECKPOINTS = MODELS / "checkpoints"
TRAIN_METRICS = MODELS / "train_metrics.json"
TRAIN_CURVE = MODELS / "train_curve.csv"
VALID_CURVE = MODELS / "valid_curve.csv"

EVAL = DATA / "eval"
EVAL_METRICS = EVAL / "metrics.json"
EVAL_TRANSLATIONS = EVAL / "translations.tsv"

ONNX_MODEL = MODELS / "model.onnx"
EXPORT_METRICS = MODELS / "export_metrics.json"
ONNX_INT8_MODEL = MODELS / "model.int8.onnx"
