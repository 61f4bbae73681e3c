"""The model a run starts from (train.init_from), as the stages after `parent` read it from
models/parent/: tokenize its tokenizer, train its weights, dims and recipe, export its lineage.
(src/parent.py finds, checks and copies it there.)

models/parent/parent.json holds what DVC and MLflow record: `init_from` as written, and for a
parent the registered `name` and `version` (a registry URI), the sha256 of its model.pt and
of its tokenizer, its languages and its ModelConfig. Nothing in it depends on when it was
written, so an alias that did not move gives the same bytes and nothing downstream re-runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from src.core.atomic import atomic_dir
from src.core.errors import PipelineError
from src.core.params import FinetuneParams, ModelParams, TrainParams

RECORD = "parent.json"
# The ModelConfig fields a params value must agree with (dropout and layerdrop may change:
# they shape training, not the network)
DIMS = ("d_model", "n_heads", "n_layers", "ffn_dim", "pre_norm", "max_positions",
        "tie_embeddings", "decoder_layers")


def parent_record(parent_dir: Path, init_from: str | None = None) -> dict | None:
    """The parent models/parent/ holds, None for random weights (or no folder: stages run by
    hand without the parent stage). With `init_from` (train's, which reads train.init_from), a
    folder resolved for another value, or none, is refused: the parent stage must run again."""
    path = Path(parent_dir) / RECORD
    # codec names are case-insensitive; None is the locale's, UTF-8 on our machines
    record = (json.loads(path.read_text(encoding="utf-8"))  # pragma: no mutate
              if path.is_file() else None)
    if init_from is not None and (record or {}).get("init_from", "") != init_from:
        held = f"holds train.init_from {record['init_from']!r}" if record else "is missing"
        raise PipelineError(f"{path} {held}, params.yaml says {init_from!r}: run "
                            f"`dvc repro parent` (or python -m src.parent) first")
    return record if record and record.get("init_from") else None


def reuse_tokenizer(parent_dir: Path, tokenizer_dir: Path) -> None:
    """The parent's SentencePiece models and meta, byte for byte, as this run's tokenizer."""
    with atomic_dir(tokenizer_dir) as tmp:
        shutil.copytree(Path(parent_dir) / "tokenizer", tmp, dirs_exist_ok=True)


def check_dims(model_params: ModelParams, config: dict, init_from: str) -> None:
    """One line naming the first params value that disagrees with the parent's network."""
    params = model_params.model_dump()
    for key in DIMS:
        wanted = params[key]
        if key == "decoder_layers":  # 0 means as many as n_layers
            wanted = wanted or params["n_layers"]
            have = config.get(key) or config.get("n_layers")
        else:
            have = config.get(key)
        if wanted != have:
            raise PipelineError(f"model.{key} is {params[key]} in params.yaml but "
                                f"{config.get(key)} in train.init_from {init_from}: set "
                                f"model.{key}: {config.get(key)} (a trained model's dims "
                                f"cannot change)")


def finetune_recipe(cfg: TrainParams, finetune: FinetuneParams) -> TrainParams:
    """train.* as a run from train.init_from trains: the finetune section's learning rate,
    warmup, epochs and bidirectional epochs (the rest as train.* says); unchanged without one."""
    if not cfg.init_from:
        return cfg
    return cfg.model_copy(update=finetune.model_dump())


def parent_tags(record: dict | None) -> dict[str, str]:
    """The lineage tags of a run or registered version trained from `record` ({} without)."""
    if not record:
        return {}
    tags = {"init_from": record["init_from"], "parent_sha256": record["sha256"]}
    if "version" in record:
        tags |= {"parent_name": record["name"], "parent_version": record["version"]}
    return tags
