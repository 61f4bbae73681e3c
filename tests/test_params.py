"""The typed params loader: the committed file loads; unknown, missing and bad keys are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from src.errors import PipelineError
from src.params import SECTIONS, ModelParams, TrainParams, load_params

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def committed() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def test_committed_params_load_every_section():
    for name, kind in SECTIONS.items():
        assert isinstance(load_params(kind, path=REPO / "params.yaml"), kind), name


def test_unknown_key_is_named(tmp_path):
    raw = committed()
    raw["train"]["learning_rate"] = 0.1
    with pytest.raises(PipelineError, match=r"unknown key 'train\.learning_rate'"):
        load_params(TrainParams, path=write(tmp_path, raw))


def test_missing_key_is_named(tmp_path):
    raw = committed()
    del raw["model"]["d_model"]
    with pytest.raises(PipelineError, match=r"missing key 'model\.d_model'"):
        load_params(ModelParams, path=write(tmp_path, raw))


def test_bad_value_is_named(tmp_path):
    raw = committed()
    raw["train"]["epochs"] = "many"
    with pytest.raises(PipelineError, match=r"bad value for 'train\.epochs'"):
        load_params(TrainParams, path=write(tmp_path, raw))
    raw["train"]["epochs"] = 0
    with pytest.raises(PipelineError, match=r"train\.epochs"):
        load_params(TrainParams, path=write(tmp_path, raw))


def test_unknown_section_and_missing_file(tmp_path):
    raw = committed()
    raw["trian"] = {}
    with pytest.raises(PipelineError, match="unknown section 'trian'"):
        load_params(TrainParams, path=write(tmp_path, raw))
    with pytest.raises(PipelineError, match="params file not found"):
        load_params(TrainParams, path=tmp_path / "nope.yaml")
