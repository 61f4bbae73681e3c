"""train.init_from resolved in process (src/parent.py, src/training/init_from.py): what the
parent folder holds and records for a file or a registered version (the registry replaced by a
recorder), and each refusal as one line with nothing written. The stage run end to end, a real
MLflow store and a fine-tune are in tests/test_init_from.py (slow)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    REPO,
    assert_one_line_error,
    run_stage_watching,
    scratch_root,
    stage_imports_torch,
)
from toy_corpus import toy_pairs

from src import parent
from src.core.errors import PipelineError
from src.core.params import FinetuneParams, ModelParams, PairParams, TrainParams
from src.data.subword import META, tokenizer_digest, train_spm
from src.nmt import checkpoint
from src.training import init_from

EN_ZH = PairParams(source_lang="en", target_lang="zh", source_column=0, target_column=1)
DIMS = {"d_model": 16, "n_heads": 2, "n_layers": 1, "ffn_dim": 32, "pre_norm": True,
        "max_positions": 32, "tie_embeddings": True, "decoder_layers": 0}


@pytest.fixture(scope="module")
def spm_model() -> bytes:
    return train_spm([side for pair in toy_pairs() for side in pair], vocab_size=400,
                     model_type="unigram", character_coverage=1.0, byte_fallback=True, seed=0)


def vocab_of(spm_model: bytes) -> int:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=spm_model).get_piece_size()


def write_parent(folder: Path, spm_model: bytes, langs=("en", "zh"), vocab: int | None = None,
                 extra: dict | None = None) -> Path:
    """A model.pt of ours (weights, config, and training state that must not come along) with
    the tokenizer/ it was trained with beside it."""
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir(parents=True)
    for side in ("source", "target"):
        (tokenizer / f"{side}.model").write_bytes(spm_model)
    (tokenizer / META).write_text(json.dumps({"source_lang": langs[0], "target_lang": langs[1],
                                              "shared_vocab": True}))
    size = vocab or vocab_of(spm_model)
    config = {"src_vocab": size, "tgt_vocab": size, **DIMS}
    checkpoint.save({"model": {"w": torch.arange(4.0)}, "config": config, **(extra or {})},
                    folder / "model.pt")
    return folder / "model.pt"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_of(call) -> str:
    with pytest.raises(PipelineError) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


# -- parent.resolve: a file -------------------------------------------------------------------

def test_no_init_from_writes_nothing_and_records_so(tmp_path):
    assert parent.resolve("", EN_ZH, tmp_path) == {"init_from": ""}
    assert list(tmp_path.iterdir()) == []


def test_a_model_file_is_copied_without_its_training_state_and_recorded(tmp_path, spm_model):
    model_pt = write_parent(tmp_path / "run", spm_model, extra={"optimizer": {"lr": 1.0}})
    dest = tmp_path / "dest"
    dest.mkdir()
    record = parent.resolve(str(model_pt), EN_ZH, dest)
    copied = checkpoint.load(dest / "model.pt")
    assert set(copied) == {"model", "config"} and copied["model"]["w"].tolist() == [0, 1, 2, 3]
    assert (dest / "tokenizer/source.model").read_bytes() == spm_model
    assert record == {
        "init_from": str(model_pt), "sha256": sha256(dest / "model.pt"),
        "tokenizer_sha256": tokenizer_digest(dest / "tokenizer"),
        "source_lang": "en", "target_lang": "zh", "config": copied["config"]}
    assert parent.sha256_of(dest / "model.pt") == sha256(dest / "model.pt")


@pytest.mark.parametrize("case, fragment", [
    ("missing", "train.init_from {path}: no such file"),
    ("not ours", "train.init_from {path} is not a checkpoint of ours (corrupt checkpoint"),
    ("no tokenizer", "train.init_from {path}: no tokenizer/ beside it"),
    ("other pair", "train.init_from {path} translates en->de, params.yaml's pair is en->zh"),
    ("vocab", "train.init_from {path}: its model's vocabularies 99/99 are not its "
              "tokenizer's {size}/{size}"),
])
def test_a_bad_file_is_one_line(tmp_path, spm_model, case, fragment):
    folder = tmp_path / "run"
    if case == "missing":
        model_pt = folder / "model.pt"
    elif case == "not ours":
        folder.mkdir()
        model_pt = folder / "model.pt"
        model_pt.write_bytes(b"not a checkpoint")
    else:
        langs = ("en", "de") if case == "other pair" else ("en", "zh")
        model_pt = write_parent(folder, spm_model, langs, vocab=99 if case == "vocab" else None)
        if case == "no tokenizer":
            shutil.rmtree(folder / "tokenizer")
    dest = tmp_path / "dest"
    dest.mkdir()
    size = vocab_of(spm_model)
    assert fragment.format(path=model_pt, size=size) in error_of(
        lambda: parent.resolve(str(model_pt), EN_ZH, dest))


# -- parent.resolve: a registered version (the registry replaced) -----------------------------

class Registry:
    """What src.core.registry answers for one registered version whose run holds `weights`."""

    def __init__(self, weights: Path):
        self.weights, self.calls = weights, []

    def install(self, monkeypatch):
        from src.core import registry

        monkeypatch.setattr(registry, "open_client", lambda: "client")
        monkeypatch.setattr(registry, "find_version", self.find_version)
        monkeypatch.setattr(registry, "download_weights", self.download)

    def find_version(self, client, ref):
        self.calls.append(("find", client, str(ref)))
        return SimpleNamespace(version=7, run_id="run-abc")

    def download(self, client, ref, version, dest):
        self.calls.append(("download", client, str(ref), version.version))
        shutil.copytree(self.weights, dest / "weights")
        return dest / "weights"


def test_a_registered_version_records_its_name_version_and_run(tmp_path, spm_model,
                                                               monkeypatch):
    write_parent(tmp_path / "weights", spm_model)
    registry = Registry(tmp_path / "weights")
    registry.install(monkeypatch)
    dest = tmp_path / "dest"
    dest.mkdir()
    record = parent.resolve("models:/nmt-en-zh@champion", EN_ZH, dest)
    assert registry.calls == [("find", "client", "models:/nmt-en-zh@champion"),
                              ("download", "client", "models:/nmt-en-zh@champion", 7)]
    assert record["name"] == "nmt-en-zh" and record["version"] == "7"
    assert record["run_id"] == "run-abc" and record["init_from"] == "models:/nmt-en-zh@champion"
    assert record["sha256"] == sha256(dest / "model.pt")
    assert sorted(p.name for p in dest.iterdir()) == ["model.pt", "tokenizer"]


def test_the_stage_writes_the_record_and_says_what_it_read(tmp_path, spm_model, monkeypatch,
                                                            capsys):
    write_parent(tmp_path / "weights", spm_model)
    Registry(tmp_path / "weights").install(monkeypatch)
    monkeypatch.setattr(parent, "load_params", lambda section: {
        TrainParams: SimpleNamespace(init_from="models:/nmt-en-zh/7"), PairParams: EN_ZH}[section])
    parent.main(out_dir=tmp_path / "out")
    record = json.loads((tmp_path / "out" / init_from.RECORD).read_text())
    assert record["version"] == "7"
    line = capsys.readouterr().out.strip()
    assert line == (f"parent: models:/nmt-en-zh/7 = nmt-en-zh version 7, model.pt sha256 "
                    f"{record['sha256'][:12]}, en->zh (read now; a later change is read by "
                    f"`dvc repro -f -s parent`)")
    # nothing set: a record that says so, and the line
    monkeypatch.setattr(parent, "load_params", lambda section: {
        TrainParams: SimpleNamespace(init_from=""), PairParams: EN_ZH}[section])
    parent.main(out_dir=tmp_path / "none")
    assert json.loads((tmp_path / "none" / init_from.RECORD).read_text()) == {"init_from": ""}
    assert capsys.readouterr().out.strip() == (
        "parent: none (no train.init_from: training starts from random weights)")


def test_the_default_stage_never_imports_torch(tmp_path):
    """With no train.init_from there is nothing to load: the stage (in every `dvc repro`) must
    not pay the seconds torch takes to import."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    imported_torch = stage_imports_torch(tmp_path, "parent")
    assert json.loads((tmp_path / "models/parent" / init_from.RECORD).read_text()) == {
        "init_from": ""}
    assert not imported_torch


def test_a_parent_the_disk_lacks_is_refused_before_torch_is_imported(tmp_path):
    """A mistyped train.init_from answers at once, not after the seconds torch takes."""
    root = scratch_root(tmp_path, train={"init_from": str(tmp_path / "nowhere/model.pt")})
    result, imported = run_stage_watching(root, "parent", ("torch",))
    assert_one_line_error(result, "no such file")
    assert imported == []


def test_a_file_parent_line_has_no_version(tmp_path, spm_model, monkeypatch, capsys):
    model_pt = write_parent(tmp_path / "run", spm_model)
    monkeypatch.setattr(parent, "load_params", lambda section: {
        TrainParams: SimpleNamespace(init_from=str(model_pt)), PairParams: EN_ZH}[section])
    parent.main(out_dir=tmp_path / "out")
    assert capsys.readouterr().out.startswith(f"parent: {model_pt}, model.pt sha256 ")


# -- init_from: what the later stages read ----------------------------------------------------

def record_in(folder: Path, record: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / init_from.RECORD).write_text(json.dumps(record))
    return folder


def test_the_parent_record_is_none_for_random_weights_or_no_folder(tmp_path):
    assert init_from.parent_record(tmp_path / "absent") is None
    assert init_from.parent_record(record_in(tmp_path / "none", {"init_from": ""})) is None
    assert init_from.parent_record(tmp_path / "absent", init_from="") is None
    held = {"init_from": "a/model.pt", "sha256": "x"}
    assert init_from.parent_record(record_in(tmp_path / "p", held)) == held
    assert init_from.parent_record(tmp_path / "p", init_from="a/model.pt") == held


def test_a_folder_resolved_for_another_value_is_refused_naming_both(tmp_path):
    folder = record_in(tmp_path / "p", {"init_from": "a/model.pt", "sha256": "x"})
    assert error_of(lambda: init_from.parent_record(folder, init_from="b/model.pt")) == (
        f"{folder / 'parent.json'} holds train.init_from 'a/model.pt', params.yaml says "
        f"'b/model.pt': run `dvc repro parent` (or python -m src.parent) first")
    assert error_of(lambda: init_from.parent_record(tmp_path / "q", init_from="a")) == (
        f"{tmp_path / 'q' / 'parent.json'} is missing, params.yaml says 'a': run `dvc repro "
        f"parent` (or python -m src.parent) first")


def test_the_parents_tokenizer_is_reused_byte_for_byte(tmp_path, spm_model):
    write_parent(tmp_path / "p", spm_model)
    init_from.reuse_tokenizer(tmp_path / "p", tmp_path / "tok")
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == sorted([
        META, "source.model", "target.model"])
    assert tokenizer_digest(tmp_path / "tok") == tokenizer_digest(tmp_path / "p/tokenizer")


def model_params(**dims) -> ModelParams:
    return ModelParams(**({**DIMS, "dropout": 0.1, "decoder_layerdrop": 0.0} | dims))


def test_dims_that_match_pass_and_dropout_may_differ():
    init_from.check_dims(model_params(dropout=0.3), dict(DIMS), "p")
    init_from.check_dims(model_params(decoder_layers=1), dict(DIMS), "p")  # 0 = n_layers = 1
    init_from.check_dims(model_params(), DIMS | {"decoder_layers": 1}, "p")
    # a parent with fewer decoder than encoder layers, and params that say the same
    init_from.check_dims(model_params(n_layers=2, decoder_layers=1),
                         DIMS | {"n_layers": 2, "decoder_layers": 1}, "p")
    init_from.check_dims(model_params(n_layers=1, decoder_layers=2),
                         DIMS | {"n_layers": 1, "decoder_layers": 2}, "p")


@pytest.mark.parametrize("key, ours", [
    ("d_model", 32), ("n_heads", 4), ("n_layers", 2), ("ffn_dim", 64), ("pre_norm", False),
    ("max_positions", 64), ("tie_embeddings", False), ("decoder_layers", 2),
])
def test_each_dim_that_disagrees_is_named_with_both_values(key, ours):
    message = error_of(lambda: init_from.check_dims(model_params(**{key: ours}), dict(DIMS),
                                                    "models:/m/1"))
    assert message == (f"model.{key} is {ours} in params.yaml but {DIMS[key]} in "
                       f"train.init_from models:/m/1: set model.{key}: {DIMS[key]} (a trained "
                       f"model's dims cannot change)")


def test_the_finetune_section_replaces_the_schedule_only_with_a_parent():
    train = TrainParams(**{**_train_fields(), "init_from": ""})
    finetune = FinetuneParams(lr=0.0001, warmup_steps=7, epochs=3, bidirectional_epochs=0)
    assert init_from.finetune_recipe(train, finetune) is train
    tuned = init_from.finetune_recipe(train.model_copy(update={"init_from": "p.pt"}), finetune)
    assert (tuned.lr, tuned.warmup_steps, tuned.epochs, tuned.bidirectional_epochs) == (
        0.0001, 7, 3, 0)
    assert tuned.max_tokens == train.max_tokens and tuned.init_from == "p.pt"


def _train_fields() -> dict:
    import yaml

    repo = Path(__file__).resolve().parent.parent
    return yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))["train"]


def test_lineage_tags_name_the_parent_and_its_version():
    assert init_from.parent_tags(None) == {} and init_from.parent_tags({}) == {}
    assert init_from.parent_tags({"init_from": "a/model.pt", "sha256": "s"}) == {
        "init_from": "a/model.pt", "parent_sha256": "s"}
    assert init_from.parent_tags({"init_from": "models:/m@c", "sha256": "s", "name": "m",
                                  "version": "3"}) == {
        "init_from": "models:/m@c", "parent_sha256": "s", "parent_name": "m",
        "parent_version": "3"}


def test_registered_weights_that_are_not_ours_are_named_by_the_uri(tmp_path, monkeypatch):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.pt").write_bytes(b"not a checkpoint")
    Registry(weights).install(monkeypatch)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert error_of(lambda: parent.resolve("models:/nmt-en-zh/3", EN_ZH, dest)).startswith(
        "train.init_from models:/nmt-en-zh/3 is not a checkpoint of ours (corrupt checkpoint")
