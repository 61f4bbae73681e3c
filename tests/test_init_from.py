"""train.init_from: a run that starts from a trained model (a model.pt, or a registered version
resolved through a real MLflow store) learns the new pairs, keeps the parent's tokenizer byte for
byte, refuses a network or language pair that disagrees in one line, and resumes a killed
fine-tune bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    TINY_PARAMS,
    assert_one_line_error,
    run_stage,
    scratch_root,
    train_with_failpoint,
)
from toy_projects import child_of, resolve_and_tokenize, set_params

from src.core.errors import PipelineError
from src.data.subword import load_tokenizers
from src.nmt import checkpoint
from src.training.init_from import check_dims, finetune_recipe, parent_record
from src.training.validation import validation_loss

pytestmark = pytest.mark.slow


def new_pairs_loss(model_path: Path, root: Path, parent_root: Path) -> float:
    """Mean token loss of `model_path` on the child's training pairs its parent never saw."""
    from datasets import load_from_disk

    seen = set(load_from_disk(str(parent_root / "data/split"))["train"]["source"])
    train = load_from_disk(str(root / "data/tokenized"))["train"]
    rows = [(s, t) for text, s, t in zip(train["source"], train["source_ids"],
                                         train["target_ids"]) if text not in seen]
    assert len(rows) >= 10
    model, _ = checkpoint.load_model(model_path)
    sources, targets = zip(*rows)
    return validation_loss(model, list(sources), list(targets), 1000, torch.device("cpu"))


def test_a_fine_tune_learns_the_new_pairs_with_its_parents_tokenizer(toy_parent, toy_child,
                                                                      tmp_path):
    root = shutil.copytree(toy_child, tmp_path / "child")  # the shared one stays untrained
    for name in ("source.model", "target.model", "tokenizer.json"):
        assert (root / "models/tokenizer" / name).read_bytes() == \
            (toy_parent / "models/tokenizer" / name).read_bytes()
    record = json.loads((root / "models/parent/parent.json").read_text())
    assert record["sha256"] and record["init_from"] == str(toy_parent / "models/model.pt")
    result = run_stage(root, "train")
    assert result.returncode == 0, result.stderr
    assert "train.precision" not in result.stderr
    before = new_pairs_loss(toy_parent / "models/model.pt", root, toy_parent)
    after = new_pairs_loss(root / "models/model.pt", root, toy_parent)
    assert after < before - 0.1, (before, after)
    # it started from the parent: its first logged loss is the parent's level, not a random
    # model's (ln of the vocabulary, ~4.8 for 120 pieces)
    first = float((root / "models/train_curve.csv").read_text().splitlines()[1].split(",")[1])
    curve = (toy_parent / "models/train_curve.csv").read_text()
    scratch = float(curve.splitlines()[1].split(",")[1])
    assert first < scratch - 0.5, (first, scratch)


def test_the_finetune_recipe_replaces_the_schedule_only_when_a_parent_is_set():
    from src.core.params import FinetuneParams, TrainParams, load_params

    cfg, ft = load_params(TrainParams), load_params(FinetuneParams)
    assert finetune_recipe(cfg, ft) == cfg
    tuned = finetune_recipe(cfg.model_copy(update={"init_from": "m.pt"}), ft)
    assert (tuned.lr, tuned.warmup_steps, tuned.epochs, tuned.bidirectional_epochs) == (
        ft.lr, ft.warmup_steps, ft.epochs, ft.bidirectional_epochs)
    assert tuned.max_tokens == cfg.max_tokens and tuned.seed == cfg.seed


def test_params_dims_that_disagree_with_the_parent_are_refused_naming_both(toy_parent, tmp_path):
    root = child_of(tmp_path / "child", str(toy_parent / "models/model.pt"),
                    model={**TINY_PARAMS["model"], "ffn_dim": 96})
    resolve_and_tokenize(root)
    assert_one_line_error(run_stage(root, "train"),
                          "model.ffn_dim is 96 in params.yaml but 64 in train.init_from")
    assert not (root / "models/model.pt").exists()


def test_decoder_layers_zero_means_n_layers_on_both_sides():
    from src.core.params import ModelParams, load_params

    params = load_params(ModelParams).model_copy(update={"decoder_layers": 0})
    config = {**params.model_dump(), "decoder_layers": params.n_layers}
    check_dims(params, config, "m.pt")  # 0 and n_layers are the same network
    with pytest.raises(PipelineError, match="model.decoder_layers is 0 in params.yaml but 1"):
        check_dims(params, {**config, "decoder_layers": 1}, "m.pt")


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file"),
    ("not ours", "is not a checkpoint of ours"),
    ("no tokenizer", "no tokenizer/ beside it"),
    ("other pair", "translates en->zh, params.yaml's pair is en->vi"),
])
def test_a_bad_parent_is_refused_in_one_line_and_nothing_is_written(toy_parent, tmp_path,
                                                                    case, fragment):
    model_pt = tmp_path / "given/model.pt"
    model_pt.parent.mkdir()
    if case == "not ours":
        model_pt.write_bytes(b"not a checkpoint")
        shutil.copytree(toy_parent / "models/tokenizer", model_pt.parent / "tokenizer")
    elif case in {"no tokenizer", "other pair"}:
        shutil.copy(toy_parent / "models/model.pt", model_pt)
        if case == "other pair":
            shutil.copytree(toy_parent / "models/tokenizer", model_pt.parent / "tokenizer")
    root = scratch_root(tmp_path / "child", **TINY_PARAMS)
    set_params(root, train={"init_from": str(model_pt)},
               **({"pair": {"target_lang": "vi"}} if case == "other pair" else {}))
    assert_one_line_error(run_stage(root, "parent"), fragment)
    assert not (root / "models/parent").exists()


def test_stages_refuse_a_parent_folder_resolved_for_another_init_from(tmp_path):
    (tmp_path / "parent.json").write_text(json.dumps({"init_from": "a/model.pt"}))
    with pytest.raises(PipelineError, match="holds train.init_from 'a/model.pt', params.yaml "
                                            "says 'b/model.pt'"):
        parent_record(tmp_path, "b/model.pt")
    assert parent_record(tmp_path / "none", "") is None  # stages run by hand, no parent
    with pytest.raises(PipelineError, match="is missing, params.yaml says 'b/model.pt'"):
        parent_record(tmp_path / "none", "b/model.pt")


def register(store: Path, parent: Path, name: str = "nmt-en-zh", alias: str = "champion",
             tags: dict | None = None) -> str:
    """A version registered as export registers one (its run holds weights/model.pt and
    weights/tokenizer/), in a sqlite store; returns its number."""
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{store}"
    mlflow.set_tracking_uri(uri)
    # the registry named too: a registry URI an earlier test left in this process would win
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    with mlflow.start_run() as run:
        mlflow.log_artifact(str(parent / "models/model.pt"), "weights")
        mlflow.log_artifacts(str(parent / "models/tokenizer"), "weights/tokenizer")
    try:
        client.create_registered_model(name)
    except mlflow.exceptions.MlflowException:
        pass
    version = client.create_model_version(name, f"runs:/{run.info.run_id}/weights",
                                          run.info.run_id, tags=tags)
    client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def test_a_registry_alias_resolves_to_the_weights_its_version_was_exported_from(toy_parent,
                                                                                tmp_path):
    store = tmp_path / "mlflow.db"
    version = register(store, toy_parent)
    root = child_of(tmp_path / "child", "models:/nmt-en-zh@champion")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    result = run_stage(root, "parent", env=env)
    assert result.returncode == 0, result.stderr
    assert f"nmt-en-zh version {version}" in result.stdout
    record = json.loads((root / "models/parent/parent.json").read_text())
    expected = checkpoint.load(toy_parent / "models/model.pt")
    got = checkpoint.load(root / "models/parent/model.pt")
    assert (record["name"], record["version"]) == ("nmt-en-zh", version)
    assert all(torch.equal(expected["model"][k], got["model"][k]) for k in expected["model"])
    assert load_tokenizers(root / "models/parent/tokenizer").source_vocab == \
        load_tokenizers(toy_parent / "models/tokenizer").source_vocab
    # the alias did not move: the same bytes, so DVC sees nothing new downstream
    first = (root / "models/parent/parent.json").read_bytes()
    assert run_stage(root, "parent", env=env).returncode == 0
    assert (root / "models/parent/parent.json").read_bytes() == first
    # it moved (to a new version of the same weights): the record says which
    register(store, toy_parent)
    assert run_stage(root, "parent", env=env).returncode == 0
    moved = json.loads((root / "models/parent/parent.json").read_text())
    assert moved["version"] == str(int(version) + 1) and moved["sha256"] == record["sha256"]


@pytest.fixture(scope="module")
def registered_once(toy_parent, tmp_path_factory) -> Path:
    """A store holding the parent as nmt-en-zh version 1, alias champion, for tests that only
    read it (a new sqlite store is seconds of MLflow's schema migrations)."""
    store = tmp_path_factory.mktemp("registry") / "mlflow.db"
    register(store, toy_parent)
    return store


@pytest.mark.parametrize("init_from, fragment", [
    ("models:/nmt-xx-yy@champion", "no registered model 'nmt-xx-yy'"),
    ("models:/nmt-en-zh@gone", "nmt-en-zh has no alias 'gone'"),
    ("models:/nmt-en-zh/9", "nmt-en-zh has no version 9"),
])
def test_a_name_alias_or_version_the_registry_lacks_is_one_line(registered_once, tmp_path,
                                                                init_from, fragment):
    store = registered_once
    root = scratch_root(tmp_path / "child", **TINY_PARAMS)
    set_params(root, train={"init_from": init_from})
    result = run_stage(root, "parent", env={"MLFLOW_TRACKING_URI": f"sqlite:///{store}"})
    assert_one_line_error(result, fragment)
    assert not (root / "models/parent").exists()


def test_an_unreachable_tracking_store_is_one_line(tmp_path):
    root = scratch_root(tmp_path / "child", **TINY_PARAMS)
    set_params(root, train={"init_from": "models:/nmt-en-zh@champion"})
    result = run_stage(root, "parent", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9",
                                            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                                            "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"})
    assert_one_line_error(result, "the tracking store http://127.0.0.1:9 could not be read")


def test_a_malformed_registry_uri_is_refused_by_the_params_loader(tmp_path):
    root = scratch_root(tmp_path / "child", **TINY_PARAMS)
    set_params(root, train={"init_from": "models:/nmt-en-zh"})
    assert_one_line_error(run_stage(root, "parent"),
                          "write models:/<name>@<alias> or models:/<name>/<version>")


def test_a_killed_fine_tune_resumes_bit_for_bit(toy_child, tmp_path):
    root = shutil.copytree(toy_child, tmp_path / "child")  # the shared one stays untrained
    clean = tmp_path / "clean"
    shutil.copytree(root, clean)
    assert train_with_failpoint(clean).returncode == 0
    killed = train_with_failpoint(root, "after_periodic_save:7")
    assert killed.returncode == 137, killed.stderr
    resumed = train_with_failpoint(root)
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr
    expected = torch.load(clean / "models/model.pt", weights_only=True)["model"]
    got = torch.load(root / "models/model.pt", weights_only=True)["model"]
    assert all(torch.equal(expected[k], got[k]) for k in expected)
