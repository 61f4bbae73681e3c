"""src/training/resume.py in process: what makes a checkpoint resumable, what is said when it
is not, and the digest and RNG state a resume depends on (the resume tests of
tests/test_train_resume.py run the whole stage in a subprocess)."""

from __future__ import annotations

import random

import pytest
import torch

from src.core.errors import PipelineError
from src.nmt.model import ModelConfig, Transformer
from src.training.resume import (
    ResumeStore,
    TrainState,
    data_digest,
    past_caps,
    rng_state,
    set_rng_state,
)

PARAMS = {"model.d_model": 8, "train.lr": 0.001}


def tiny() -> Transformer:
    return Transformer(ModelConfig(16, 16, d_model=8, n_heads=2, n_layers=1, ffn_dim=16))


def saved(tmp_path, params=PARAMS, data="d1", state=None) -> ResumeStore:
    store = ResumeStore(tmp_path / "ckpt", params, data)
    store.save(state or TrainState(step=7, epoch=1), tiny())
    return store


def test_the_same_params_and_data_resume(tmp_path):
    saved(tmp_path)
    ckpt = ResumeStore(tmp_path / "ckpt", dict(PARAMS), "d1").load()
    assert ckpt["state"]["step"] == 7 and ckpt["trajectory"] == PARAMS


def test_each_reason_not_to_resume_is_named(tmp_path, capsys):
    cases = [
        (dict(PARAMS, **{"train.lr": 0.0005}), "d1",
         "params changed: train.lr 0.001 -> 0.0005"),
        (dict(PARAMS, **{"train.seed": 1}), "d1", "params changed: train.seed '(unset)' -> 1"),
        ({"model.d_model": 8}, "d1", "params changed: train.lr removed"),
        (PARAMS, "d2", "the tokenized data or the tokenizer changed"),
    ]
    for n, (params, data, reason) in enumerate(cases):
        saved(tmp_path / str(n))
        store = ResumeStore(tmp_path / str(n) / "ckpt", params, data)
        assert store.load() is None
        err = capsys.readouterr().err
        assert f"cannot be resumed ({reason}); moved it to " in err, err
        assert not store.last.exists() and list((tmp_path / str(n)).glob("ckpt.old-*"))


def test_old_or_foreign_checkpoints_are_set_aside(tmp_path, capsys):
    store = saved(tmp_path)
    ckpt = torch.load(store.last, weights_only=True)
    assert store.mismatch({k: v for k, v in ckpt.items() if k != "trajectory"}) == \
        "it was written by an older version of train"
    assert store.mismatch({k: v for k, v in ckpt.items() if k != "state"}) == \
        "it was written by an older version of train"
    foreign = dict(ckpt, state=dict(ckpt["state"], unknown_field=1))
    assert store.mismatch(foreign) == "it was written by another version of train"
    assert store.mismatch(ckpt) == ""
    store.last.unlink()
    assert store.load() is None and capsys.readouterr().err == ""  # nothing there: no note
    (store.dir / "epoch1.pt").write_bytes(b"an epoch")  # epoch files without last.pt
    assert store.load() is None
    assert "(it has epoch checkpoints but no last.pt)" in capsys.readouterr().err


def test_a_second_set_aside_in_the_same_second_gets_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda fmt: "20261126-120000")
    for _ in range(3):
        store = saved(tmp_path)
        store.set_aside("test")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt", "ckpt.old-20261126-120000", "ckpt.old-20261126-120000-2",
                     "ckpt.old-20261126-120000-3"]
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_caps_below_what_was_trained_are_named():
    assert past_caps({"step": 40, "epoch": 2}, {"step": 40, "epoch": 2}) == ""
    assert past_caps({"step": 40, "epoch": 2}, {"step": 0, "epoch": 0}) == ""  # 0: no cap
    assert past_caps({"step": 40, "epoch": 2}, {"step": 39}) == \
        "it has trained past train.max_steps=39 (step 40)"
    assert past_caps({"step": 4, "epoch": 3}, {"step": 0, "epoch": 2}) == \
        "it has trained past train.epochs=2 (epoch 3)"


def test_a_corrupt_last_pt_is_one_instruction(tmp_path):
    store = saved(tmp_path)
    store.last.write_bytes(b"not a checkpoint")
    with pytest.raises(PipelineError, match="; move .*ckpt away to train from scratch"):
        store.load()


def test_stale_temporary_files_are_removed_on_start(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / ".last.pt.abc.tmp").write_bytes(b"half")
    (folder / "epoch1.pt").write_bytes(b"kept")
    ResumeStore(folder, PARAMS, "d1")
    assert sorted(p.name for p in folder.iterdir()) == ["epoch1.pt"]


def test_the_data_digest_covers_names_and_bytes_of_every_file_but_hidden_ones(tmp_path):
    data, tok = tmp_path / "data", tmp_path / "tok"
    (data / "train").mkdir(parents=True)
    tok.mkdir()
    (data / "train/a.arrow").write_bytes(b"ids")
    (tok / "source.model").write_bytes(b"spm")
    first = data_digest(data, tok)
    assert first == data_digest(data, tok) and len(first) == 64
    (data / ".lock").write_bytes(b"ignored")
    assert data_digest(data, tok) == first
    (data / "train/a.arrow").write_bytes(b"idz")
    changed_bytes = data_digest(data, tok)
    (data / "train/a.arrow").rename(data / "train/b.arrow")
    assert len({first, changed_bytes, data_digest(data, tok)}) == 3
    assert data_digest(tok, data) != data_digest(data, tok)


def test_rng_state_round_trips_python_and_torch():
    state = rng_state()
    expected = (random.random(), torch.rand(3))
    random.seed(123)
    torch.manual_seed(123)
    set_rng_state(state)
    again = (random.random(), torch.rand(3))
    assert again[0] == expected[0] and torch.equal(again[1], expected[1])
    assert state["cuda"] is None or torch.cuda.is_available()


def test_what_last_pt_holds(tmp_path):
    store = ResumeStore(tmp_path / "ckpt", PARAMS, "d1")
    store.save(TrainState(step=3), tiny(), optimizer={"lr": 0.5})
    ckpt = torch.load(store.last, weights_only=True)
    assert ckpt["optimizer"] == {"lr": 0.5} and ckpt["data"] == "d1"
    assert isinstance(ckpt["rng"], list) and len(ckpt["rng"]) == 1  # this process's state
    assert torch.equal(ckpt["rng"][0]["torch"], torch.get_rng_state())
    store.save(TrainState(step=3), tiny(), rng=[{"rank": 0}, {"rank": 1}])
    assert torch.load(store.last, weights_only=True)["rng"] == [{"rank": 0}, {"rank": 1}]


def test_several_changes_are_listed_and_the_folder_is_stamped(tmp_path, capsys):
    import re

    saved(tmp_path)
    store = ResumeStore(tmp_path / "ckpt", {"model.d_model": 16, "train.lr": 0.01}, "d1")
    assert store.load() is None
    err = capsys.readouterr().err
    assert ("(params changed: model.d_model 8 -> 16, train.lr 0.001 -> 0.01); moved it to "
            in err) and err.rstrip().endswith("and starting afresh")
    assert re.fullmatch(r"ckpt\.old-\d{8}-\d{6}", next(tmp_path.glob("ckpt.old-*")).name)


def test_a_missing_or_unnamed_cap_key():
    assert past_caps({}, {"step": 5}) == ""  # a state without the key has trained none of it
    assert past_caps({"tokens": 10}, {"tokens": 5}) == \
        "it has trained past tokens=5 (tokens 10)"


def test_the_resolved_precision_is_part_of_the_trajectory():
    from helpers import train_cfg

    from src.core.params import ModelParams
    from src.training.resume import trajectory_params

    model = ModelParams(d_model=8, n_heads=2, n_layers=1, ffn_dim=16, dropout=0.0,
                        pre_norm=True, max_positions=16, tie_embeddings=True,
                        decoder_layerdrop=0.0, decoder_layers=0)
    bf16 = trajectory_params(model, train_cfg(precision="auto"), "bf16")
    assert bf16["train.precision"] == "bf16"
    assert trajectory_params(model, train_cfg(precision="auto"), "fp32") != bf16
