"""Training pieces: token batches, LR schedule, the loss over non-pad tokens, checkpoints."""

from __future__ import annotations

import math
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, train_cfg
from torch.utils._python_dispatch import TorchDispatchMode

from src.core.errors import PipelineError
from src.data.augment import (
    EpochPairs,
    Segmentations,
    TrainingCorpus,
    drop_target_words,
    joined_pairs,
)
from src.data.batching import Ragged, make_batch, token_batches
from src.data.subword import BOS, EOS, PAD, UNK
from src.nmt import checkpoint
from src.nmt.model import ModelConfig, Transformer
from src.training.epochs import out_of_budget
from src.training.resume import TrainState
from src.training.selection import EpochSelection
from src.training.step import AdamW, lr_factor
from src.training.validation import token_loss


def test_make_batch_adds_bos_eos_and_pads():
    batch = make_batch([[5, 6], [7]], [[8], [9, 10]], max_positions=16)
    assert batch.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 8, PAD], [BOS, 9, 10]]
    assert batch.tgt_out.tolist() == [[8, EOS, PAD], [9, 10, EOS]]
    assert batch.n_tokens == 5 + 5


def test_token_batches_respect_budget_and_cover_everything():
    src_lens = [3, 10, 4, 25, 7, 7, 1, 12] * 20
    tgt_lens = [2, 9, 5, 20, 6, 8, 1, 11] * 20
    batches = token_batches(src_lens, tgt_lens, max_tokens=120, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(len(src_lens)))
    for b in batches:
        width = max(src_lens[i] for i in b) + 1 + max(tgt_lens[i] for i in b) + 1
        assert len(b) == 1 or len(b) * width <= 120
    assert batches == token_batches(src_lens, tgt_lens, max_tokens=120, seed=3)
    assert batches != token_batches(src_lens, tgt_lens, max_tokens=120, seed=4)


def ragged(rows: list[list[int]]) -> Ragged:
    return Ragged.from_rows(rows)


def test_concatenation_joins_two_other_pairs_on_both_sides():
    sources = ragged([[10, 11], [12], [13, 14, 15], [16], [17, 18]])
    targets = ragged([[20], [21, 22], [23], [24, 25], [26]])
    joined = joined_pairs(5, 0.4, (0, 0))
    assert joined.shape == (2, 2) and all(a != b for a, b in joined)
    pairs = EpochPairs(sources, targets, joined)
    assert len(pairs) == 7
    assert pairs.source(1).tolist() == [12] and pairs.target(3).tolist() == [24, 25]
    for k, (a, b) in enumerate(joined.tolist()):
        assert pairs.source(5 + k).tolist() == sources[a].tolist() + sources[b].tolist()
        assert pairs.target(5 + k).tolist() == targets[a].tolist() + targets[b].tolist()
    src_lens, tgt_lens = pairs.lengths()
    assert src_lens.tolist() == [len(pairs.source(i)) for i in range(7)]
    assert tgt_lens.tolist() == [len(pairs.target(i)) for i in range(7)]


def test_concatenation_is_drawn_afresh_each_epoch_from_the_seed():
    data = (ragged([[i] for i in range(200)]), ragged([[i] for i in range(200)]))
    corpus = TrainingCorpus(data, seed=0, concat_ratio=0.5)
    first = corpus.epoch(0).joined
    assert len(first) == 100
    resumed = TrainingCorpus(data, seed=0, concat_ratio=0.5)  # a resume sees the same
    assert np.array_equal(first, resumed.epoch(0).joined)
    assert not np.array_equal(first, corpus.epoch(1).joined)
    # off: the corpus alone, so the default run's batches are exactly as before
    plain = TrainingCorpus(data, seed=0).epoch(0)
    assert len(plain) == 200 and np.array_equal(plain.lengths()[0], data[0].lengths())


def test_a_corpus_weighted_per_epoch_shows_a_new_share_of_its_pairs_each_epoch():
    """Pairs 0-3 train every epoch; pairs 4-23, a corpus at weight 0.25 per epoch, five at a
    time, other ones each epoch and the same ones for a resumed run."""
    data = (ragged([[i] for i in range(24)]), ragged([[100 + i] for i in range(24)]))
    drawn = np.array([0.0] * 4 + [0.25] * 20, np.float32)
    corpus = TrainingCorpus(data, seed=0, drawn_weight=drawn, bidirectional_epochs=1)

    def pairs(epoch: int) -> list[tuple[int, int]]:
        got = corpus.epoch(epoch)
        return [(got.source(i)[0], got.target(i)[0]) for i in range(len(got))]

    both_ways = pairs(0)
    assert len(both_ways) == 18 and both_ways[9:] == [(t, s) for s, t in both_ways[:9]]
    epochs = [pairs(epoch) for epoch in (1, 2)]
    for got in epochs:
        assert got[:4] == [(i, 100 + i) for i in range(4)]
        assert len(got) == 9 and all(4 <= s < 24 and t == 100 + s for s, t in got[4:])
    assert epochs[0][4:] != epochs[1][4:]
    resumed = TrainingCorpus(data, seed=0, drawn_weight=drawn, bidirectional_epochs=1)
    assert resumed.epoch(2).sources.tolist() == corpus.epoch(2).sources.tolist()


def test_an_epoch_counted_at_start_up_is_not_built_again_to_train_on(monkeypatch):
    data = (ragged([[i] for i in range(20)]), ragged([[i] for i in range(20)]))
    corpus = TrainingCorpus(data, seed=0, concat_ratio=0.5, bidirectional_epochs=2)
    built, build = [], corpus._build
    monkeypatch.setattr(corpus, "_build", lambda epoch: built.append(epoch) or build(epoch))
    for epoch in (2, 0, 0, 1, 2):  # train's start-up counts epochs 2 and 0, then trains
        corpus.epoch(epoch)
    assert built == [2, 0, 1, 2]


def test_bidirectional_epochs_add_every_pair_reversed_then_stop():
    sources, targets = ragged([[10, 11], [12], [13]]), ragged([[20], [21, 22], [23, 24, 25]])
    corpus = TrainingCorpus((sources, targets), seed=0, bidirectional_epochs=2)
    for epoch in (0, 1):
        pairs = corpus.epoch(epoch)
        assert len(pairs) == 6
        assert [pairs.source(i).tolist() for i in range(6)] == sources.tolist() + targets.tolist()
        assert [pairs.target(i).tolist() for i in range(6)] == targets.tolist() + sources.tolist()
        assert pairs.lengths()[0].tolist() == [2, 1, 1, 1, 2, 3]
    later = corpus.epoch(2)
    assert len(later) == 3 and [later.source(i).tolist() for i in range(3)] == sources.tolist()
    # concatenation draws from both directions while they are there
    mixed = TrainingCorpus((sources, targets), seed=0, concat_ratio=1.0, bidirectional_epochs=1)
    assert len(mixed.epoch(0)) == 12 and len(mixed.epoch(1)) == 6


def test_segmentations_are_drawn_by_probability_to_the_power_alpha():
    # sentence 0: candidates [5] (log p -1) and [6, 7] (log p -3); sentence 1: only [8, 9]
    seg = Segmentations(values=np.array([5, 6, 7, 8, 9], np.int32),
                        offsets=np.array([0, 1, 3, 5]), scores=np.array([-1.0, -3.0, -2.0]),
                        first=np.array([0, 2, 3]))
    rng = np.random.default_rng(0)
    draws = [seg.sample(0.5, rng).tolist() for _ in range(4000)]
    assert all(d[1] == [8, 9] for d in draws)
    share = sum(d[0] == [5] for d in draws) / len(draws)
    expected = 1 / (1 + math.exp(0.5 * -3.0 - 0.5 * -1.0))  # e^-0.5 / (e^-0.5 + e^-1.5)
    assert abs(share - expected) < 0.03
    assert all(seg.sample(50.0, rng).tolist()[0] == [5] for _ in range(50))  # ~ always best


def test_subword_sampling_redraws_each_epoch_the_same_way_in_any_process(tmp_path):
    import subprocess
    import sys

    import sentencepiece as spm

    from src.data.subword import train_spm

    text = ["the quick brown fox jumps over the lazy dog", "a friend in need is a friend indeed",
            "she sells sea shells by the sea shore", "peter piper picked a peck of peppers"]
    model = train_spm(text * 50, vocab_size=60, model_type="unigram", character_coverage=1.0,
                      byte_fallback=False, seed=0)
    sp = spm.SentencePieceProcessor(model_proto=model)
    best = ragged(sp.encode(text))
    candidates = Segmentations.of(sp, text)
    corpus = TrainingCorpus((best, best), seed=0, subword_alpha=0.2,
                            candidates=(candidates, candidates))
    first, again, second = corpus.epoch(0), corpus.epoch(0), corpus.epoch(1)
    rows = [first.source(i).tolist() for i in range(4)]
    assert [sp.decode(r) for r in rows] == text  # the same sentences, other pieces
    assert rows != best.tolist()
    assert rows == [again.source(i).tolist() for i in range(4)]
    assert rows != [second.source(i).tolist() for i in range(4)]
    assert [first.target(i).tolist() for i in range(4)] != rows  # each side its own draw
    # another process draws the same (SentencePiece's own sampling would not)
    (tmp_path / "spm.model").write_bytes(model)
    code = ("import sentencepiece as spm, sys; from src.data.augment import Segmentations, "
            "TrainingCorpus; from src.data.batching import Ragged\n"
            f"text = {text!r}\n"
            f"sp = spm.SentencePieceProcessor(model_file={str(tmp_path / 'spm.model')!r})\n"
            "c = Segmentations.of(sp, text); best = Ragged.from_rows(sp.encode(text))\n"
            "e = TrainingCorpus((best, best), 0, 0.0, 0.2, (c, c)).epoch(0)\n"
            "print([e.source(i).tolist() for i in range(4)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, check=True).stdout
    assert out.strip() == str(rows)


def test_target_word_dropout_hides_only_subwords_at_the_rate_asked():
    tgt_in = torch.tensor([[BOS] + [10] * 999 + [PAD] * 1000])
    torch.manual_seed(0)
    dropped = drop_target_words(tgt_in, 0.3)
    assert dropped[0, 0] == BOS and bool((dropped[0, 1000:] == PAD).all())
    hidden = (dropped[0, 1:1000] == UNK).float().mean().item()
    assert abs(hidden - 0.3) < 0.05 and bool(((dropped == 10) | (dropped == UNK))[0, 1:1000].all())
    torch.manual_seed(0)
    assert torch.equal(drop_target_words(tgt_in, 0.3), dropped)  # torch's RNG, as saved
    assert drop_target_words(tgt_in, 0.0) is tgt_in


def test_inverse_sqrt_schedule_hand_values():
    cfg = train_cfg(warmup_steps=4)
    assert [lr_factor(s, cfg, 100) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(lr_factor(15, cfg, 100), math.sqrt(4 / 16))


def test_cosine_schedule_hand_values():
    cfg = train_cfg(warmup_steps=2, schedule="cosine")
    assert lr_factor(0, cfg, 12) == 0.5
    assert lr_factor(2, cfg, 12) == 1.0
    assert math.isclose(lr_factor(7, cfg, 12), 0.5)  # half way through the decay
    assert math.isclose(lr_factor(12, cfg, 12), 0.0, abs_tol=1e-12)


def test_our_adamw_steps_saves_and_resumes_as_torchs_bit_for_bit():
    torch.manual_seed(0)
    ours_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
    torch_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5))
    torch_model.load_state_dict(ours_model.state_dict())

    def make(optimizer, model):
        groups = [{"params": [model[0].weight], "weight_decay": 0.1},
                  {"params": [model[0].bias, *model[1].parameters()], "weight_decay": 0.0}]
        return optimizer(groups, lr=0.01, betas=(0.9, 0.98), eps=1e-9, fused=True)

    ours, theirs = make(AdamW, ours_model), make(torch.optim.AdamW, torch_model)
    for step in range(4):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(step))
        for model, optimizer in ((ours_model, ours), (torch_model, theirs)):
            model(x).square().sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step == 1:  # resume ours from its own state_dict, as last.pt does
            saved = ours.state_dict()
            ours = make(AdamW, ours_model)
            ours.load_state_dict(saved)
    for mine, reference in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert mine.grad is None and torch.equal(mine, reference)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert mine["param_groups"] == reference["param_groups"]
    assert {i: state.keys() for i, state in mine["state"].items()} == {
        i: state.keys() for i, state in reference["state"].items()}
    assert all(torch.equal(state[key], reference["state"][i][key])
               for i, state in mine["state"].items() for key in state)


def test_the_optimizer_never_imports_the_compiler():
    # torch's own AdamW imports torch._dynamo (~1.3 s) on construction and on every step.
    code = (
        "import sys, torch\n"
        "from src.training.step import AdamW\n"
        "w = torch.nn.Parameter(torch.ones(3))\n"
        "opt = AdamW([w], lr=0.1, fused=True)\n"
        "w.sum().backward(); opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())\n"
        "assert w.grad is None and w.tolist() != [1.0, 1.0, 1.0]\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_token_loss_ignores_padding():
    torch.manual_seed(0)
    config = ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=1, ffn_dim=32, dropout=0.0)
    model = Transformer(config).eval()
    batch = make_batch([[5, 6], [7]], [[8], [9, 10]], max_positions=16)
    loss, nll, n = token_loss(model, batch, label_smoothing=0.1)
    logits = model(batch.src, batch.tgt_in)
    keep = batch.tgt_out != PAD
    assert n == 5
    ref_nll = F.cross_entropy(logits[keep], batch.tgt_out[keep], reduction="sum")
    logp = logits[keep].log_softmax(-1)
    gold = -logp.gather(1, batch.tgt_out[keep][:, None]).squeeze(1)
    ref_loss = (0.9 * gold + 0.1 * -logp.mean(-1)).sum()
    assert torch.allclose(nll, ref_nll, atol=1e-4)
    assert torch.allclose(loss, ref_loss, atol=1e-4)


def test_checkpoint_roundtrip_and_corruption(tmp_path):
    model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=1, ffn_dim=32))
    path = tmp_path / "model.pt"
    checkpoint.save(checkpoint.model_state(model), path)
    loaded, _ = checkpoint.load_model(path)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )
    path.write_bytes(path.read_bytes()[:1000])  # truncated, as after a crash mid-copy
    with pytest.raises(PipelineError, match="corrupt checkpoint"):
        checkpoint.load_model(path)
    with pytest.raises(PipelineError, match="not found"):
        checkpoint.load_model(tmp_path / "missing.pt")


def test_equal_weights_save_to_equal_bytes(tmp_path):
    """A re-run that trains the same weights writes the same model.pt, so dvc.lock's hash
    repeats too (torch named the archive's inner folder after the random temporary file)."""
    model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=1, ffn_dim=32))
    first, again = tmp_path / "a" / "model.pt", tmp_path / "b" / "model.pt"
    checkpoint.save(checkpoint.model_state(model), first)
    checkpoint.save(checkpoint.model_state(model), again)
    assert first.read_bytes() == again.read_bytes()


class Payload:
    """Unpickling this calls Path.touch: what a crafted checkpoint would do with os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_loading_a_crafted_checkpoint_runs_no_code(tmp_path):
    model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=1, ffn_dim=32))
    marker = tmp_path / "payload-ran"
    path = tmp_path / "crafted.pt"
    torch.save(checkpoint.model_state(model, extra=Payload(marker)), path)
    with pytest.raises(PipelineError, match="corrupt checkpoint"):
        checkpoint.load(path)
    assert not marker.exists()


def test_average_state_dicts():
    a = {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(7)}
    b = {"w": torch.tensor([3.0, 5.0]), "n": torch.tensor(7)}
    avg = checkpoint.average_state_dicts([a, b])
    assert avg["w"].tolist() == [2.0, 4.0] and avg["n"].item() == 7


def test_budget_in_steps_or_training_minutes():
    assert not out_of_budget(train_cfg(), TrainState(step=10**6, train_seconds=10**6))
    assert out_of_budget(train_cfg(max_steps=5), TrainState(step=5))
    assert not out_of_budget(train_cfg(max_steps=5), TrainState(step=4))
    assert out_of_budget(train_cfg(max_minutes=0.5), TrainState(train_seconds=30.0))
    assert not out_of_budget(train_cfg(max_minutes=0.5), TrainState(train_seconds=29.9))


def test_epochs_are_kept_and_ranked_by_criterion(tmp_path):
    """Only the `average_best` lowest-criterion epochs stay on disk; best.pt follows the best."""
    config = ModelConfig(16, 16, d_model=8, n_heads=2, n_layers=1, ffn_dim=16, dropout=0.0,
                         max_positions=16)
    model = Transformer(config)
    state = TrainState()
    selection = EpochSelection(tmp_path, state, average_best=2, patience=2)
    # criterion is minus valid BLEU: epoch 1 (BLEU 20) is best, then epoch 3 (BLEU 15)
    improved = []
    for epoch, criterion in enumerate([-20.0, -10.0, -15.0]):
        with torch.no_grad():
            next(model.parameters()).fill_(float(epoch))
        improved.append(selection.record(model, epoch, criterion))
    assert improved == [True, False, False] and state.bad_epochs == 2
    assert selection.patience_spent()
    # nothing is deleted until the caller has saved the new ranking and prunes
    assert sorted(p.name for p in tmp_path.glob("epoch*.pt")) == [
        "epoch1.pt", "epoch2.pt", "epoch3.pt"]
    selection.prune()
    assert sorted(p.name for p in tmp_path.glob("epoch*.pt")) == ["epoch1.pt", "epoch3.pt"]
    assert state.epoch_criteria == {0: -20.0, 2: -15.0}
    best = checkpoint.load(tmp_path / "best.pt")["model"]
    assert float(next(iter(best.values())).flatten()[0]) == 0.0  # written at epoch 1 only
    weights, epochs = selection.averaged_weights()
    assert epochs == [1, 3] and float(next(iter(weights.values())).flatten()[0]) == 1.0


def test_a_tie_is_not_an_improvement_and_averaging_lists_the_best_first(tmp_path):
    """A later epoch that only equals the best neither replaces best.pt nor resets patience;
    averaged epochs come best first (not in epoch order); patience 0 never stops training."""
    model = Transformer(ModelConfig(16, 16, d_model=8, n_heads=2, n_layers=1, ffn_dim=16,
                                    dropout=0.0, max_positions=16))
    state = TrainState()
    selection = EpochSelection(tmp_path, state, average_best=3, patience=0)
    improved = []
    for epoch, criterion in enumerate([-10.0, -30.0, -20.0, -30.0]):
        with torch.no_grad():
            next(model.parameters()).fill_(float(epoch))
        improved.append(selection.record(model, epoch, criterion))
    assert improved == [True, True, False, False] and state.bad_epochs == 2
    best = checkpoint.load(tmp_path / "best.pt")["model"]
    assert float(next(iter(best.values())).flatten()[0]) == 1.0  # epoch 2, not the tie
    assert not selection.patience_spent()  # patience 0: never
    _, epochs = selection.averaged_weights()
    assert epochs == [2, 4, 3]
    selection.prune()
    assert sorted(p.name for p in tmp_path.glob("epoch*.pt")) == [
        "epoch2.pt", "epoch3.pt", "epoch4.pt"]


def test_a_params_change_moves_checkpoints_aside_instead_of_deleting(tmp_path, capsys):
    from src.core.params import ModelParams
    from src.training.resume import ResumeStore, trajectory_params

    model_params = ModelParams(d_model=8, n_heads=2, n_layers=1, ffn_dim=16, dropout=0.0,
                               pre_norm=True, max_positions=16, tie_embeddings=True,
                               decoder_layerdrop=0.0, decoder_layers=0)
    model = Transformer(ModelConfig(16, 16, d_model=8, n_heads=2, n_layers=1, ffn_dim=16))
    ckpts = tmp_path / "checkpoints"
    params = trajectory_params(model_params, train_cfg(), "fp32")
    ResumeStore(ckpts, params, "data-v1").save(TrainState(step=7), model)
    (ckpts / "epoch1.pt").write_bytes(b"an epoch checkpoint")

    # knobs that do not shape the trajectory: the same checkpoint resumes
    free = train_cfg(threads=1, log_every_steps=99, max_minutes=5, patience=9, epochs=40,
                     max_steps=1000, average_best=7)
    ckpt = ResumeStore(ckpts, trajectory_params(model_params, free, "fp32"), "data-v1").load()
    assert ckpt is not None and ckpt["state"]["step"] == 7

    # a learning-rate change: moved aside whole, and stderr names the key
    changed = trajectory_params(model_params, train_cfg(lr=5e-4), "fp32")
    assert ResumeStore(ckpts, changed, "data-v1").load() is None
    err = capsys.readouterr().err
    assert "train.lr 0.001 -> 0.0005" in err and "moved it to" in err
    (aside,) = tmp_path.glob("checkpoints.old-*")
    assert sorted(p.name for p in aside.iterdir()) == ["epoch1.pt", "last.pt"]
    assert list(ckpts.iterdir()) == []


def test_other_data_or_cosine_horizon_is_not_resumed(tmp_path, capsys):
    from src.core.params import ModelParams
    from src.training.resume import ResumeStore, trajectory_params

    model_params = ModelParams(d_model=8, n_heads=2, n_layers=1, ffn_dim=16, dropout=0.0,
                               pre_norm=True, max_positions=16, tie_embeddings=True,
                               decoder_layerdrop=0.0, decoder_layers=0)
    model = Transformer(ModelConfig(16, 16, d_model=8, n_heads=2, n_layers=1, ffn_dim=16))
    cosine = trajectory_params(model_params, train_cfg(schedule="cosine", epochs=3), "fp32")
    ResumeStore(tmp_path / "c", cosine, "data-v1").save(TrainState(), model)
    assert ResumeStore(tmp_path / "c", cosine, "data-v2").load() is None
    assert "data or the tokenizer changed" in capsys.readouterr().err
    ResumeStore(tmp_path / "c", cosine, "data-v1").save(TrainState(), model)
    longer = trajectory_params(model_params, train_cfg(schedule="cosine", epochs=4), "fp32")
    assert ResumeStore(tmp_path / "c", longer, "data-v1").load() is None  # the LR decay differs
    assert "train.epochs 3 -> 4" in capsys.readouterr().err


def test_an_mlflow_failure_does_not_stop_the_stage(monkeypatch, capsys):
    import mlflow

    from src.core import tracking

    def broken(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("database is locked")

    monkeypatch.setattr(mlflow, "log_metrics", broken)
    monkeypatch.setattr(tracking, "_warned", set())
    run = tracking.MlflowRun(client=None, run_id="r")
    for step in range(3):
        run.log_metrics({"train_loss": 1.0}, step=step)  # must not raise
    err = capsys.readouterr().err
    assert err.count("warning: MLflow log_metrics failed") == 1 and "database is locked" in err


def test_an_unreachable_tracking_store_runs_the_stage_untracked(monkeypatch, capsys):
    """A real tracking URI where nothing listens: the stage body runs, on the do-nothing run
    (exactly NullRun, not an MlflowRun), with one warning."""
    import mlflow

    from src.core import tracking
    from src.core.local_servers import free_port

    before = mlflow.get_tracking_uri()
    monkeypatch.setenv("NMT_TRACKING", "on")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setattr(tracking, "_warned", set())
    ran = []
    try:
        with tracking.stage_run("train", {"train": {"lr": 0.1}}) as run:
            run.log_metrics({"x": 1.0})
            ran.append(True)
    finally:
        mlflow.set_tracking_uri(before)
    assert ran and type(run) is tracking.NullRun
    err = capsys.readouterr().err
    assert err.count("warning: MLflow tracking failed") == 1, err
    assert "the stage goes on" in err


def test_a_checkpoint_past_a_lowered_cap_is_set_aside(tmp_path, capsys):
    """Lowering train.max_steps below the steps taken cannot be honoured by resuming."""
    from src.training.resume import ResumeStore

    model = Transformer(ModelConfig(16, 16, d_model=8, n_heads=2, n_layers=1, ffn_dim=16))
    ResumeStore(tmp_path / "c", {}, "d").save(TrainState(step=40, epoch=2), model)
    assert ResumeStore(tmp_path / "c", {}, "d").load(caps={"step": 40, "epoch": 2}) is not None
    assert ResumeStore(tmp_path / "c", {}, "d").load(caps={"step": 7, "epoch": 2}) is None
    assert "past train.max_steps=7 (step 40)" in capsys.readouterr().err



FREE_AND_MEASURE = """
import sys, numpy as np, psutil
from src.training.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
rss = psutil.Process().memory_info
block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, above any mmap threshold
held = rss().rss
del block
print((held - rss().rss) >> 20)  # MiB given back to the kernel by the free
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_freed_blocks_stay_in_the_process_for_the_next_step_to_reuse():
    import subprocess

    def given_back(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", FREE_AND_MEASURE, mode], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        return int(out)

    assert given_back("default") >= 60  # glibc unmaps a large block on free...
    assert given_back("keep") < 4  # ...unless told to keep it


def test_rdrop_loss_matches_hand_computed_values():
    from src.training.loss import rdrop_loss

    # V = 2, gold 1. Pass 1: logits (0, 0), P1 = (1/2, 1/2); pass 2: (0, ln 3), P2 = (1/4, 3/4).
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]], requires_grad=True)
    ce1, ce2 = math.log(2), -math.log(0.75)
    kl12 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    kl21 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    loss, nll = rdrop_loss(logits, torch.tensor([1]), eps=0.0, alpha=1.0)
    assert loss.item() == pytest.approx(0.5 * (ce1 + ce2 + 0.5 * (kl12 + kl21)), abs=1e-6)
    assert nll.item() == pytest.approx(0.5 * (ce1 + ce2), abs=1e-6)
    loss.backward()
    assert logits.grad.abs().sum() > 0


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_rdrop_loss_and_gradient_match_autograd_of_the_papers_formula(eps):
    """The one-pass loss against the formula written with library ops and autograd's gradient:
    smoothed CE of both passes plus alpha/2 times the two KL divergences, halved."""
    from src.training.loss import rdrop_loss

    torch.manual_seed(0)
    labels = torch.randint(0, 11, (6,))
    logits = (3 * torch.randn(12, 11)).requires_grad_()
    loss, nll = rdrop_loss(logits, labels, eps=eps, alpha=5.0)
    loss.backward()
    ours = logits.grad.clone()

    logits.grad = None
    gold = torch.cat([labels, labels])
    ce = F.cross_entropy(logits, gold, label_smoothing=eps, reduction="sum")
    log_p1, log_p2 = F.log_softmax(logits, dim=1).chunk(2)
    kl = (F.kl_div(log_p2, log_p1, reduction="sum", log_target=True)
          + F.kl_div(log_p1, log_p2, reduction="sum", log_target=True))
    reference = 0.5 * (ce + 5.0 / 2 * kl)
    reference.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert nll.item() == pytest.approx(0.5 * F.cross_entropy(logits, gold, reduction="sum").item(),
                                       rel=1e-5)
    assert torch.allclose(ours, logits.grad, atol=1e-5)


def test_rdrop_runs_the_batch_twice_with_its_own_dropout_masks():
    batch = make_batch([[5, 6], [7]], [[8], [9, 10]], max_positions=16)
    for dropout in (0.0, 0.3):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=1, ffn_dim=32,
                                        dropout=dropout))
        torch.manual_seed(1)
        plain, plain_nll, n = token_loss(model, batch, 0.1)
        torch.manual_seed(1)
        rdrop, rdrop_nll, n_rdrop = token_loss(model, batch, 0.1, rdrop_alpha=5.0)
        assert n == n_rdrop == 5  # the normaliser counts each token once
        if dropout == 0.0:  # two identical passes: no KL, the same loss as one pass
            assert torch.allclose(rdrop, plain, atol=1e-5)
            assert torch.allclose(rdrop_nll, plain_nll, atol=1e-5)
        else:  # two masks: the passes differ, so the KL term (alpha 5 against ~0) is positive
            torch.manual_seed(1)
            no_kl = token_loss(model, batch, 0.1, rdrop_alpha=1e-9)[0]
            assert rdrop.item() > no_kl.item() + 1e-3


def test_valid_bleu_uses_the_length_ratio_of_params(monkeypatch):
    """train.valid_max_length_ratio reaches the valid search (it was a constant 2.0)."""
    from src.training import validation

    seen = []

    def fake_translate(model, sources, beam, length_penalty, ratio, batch_size):
        seen.append(ratio)
        return [[5] for _ in sources]

    class Tokenizers:
        def decode_target(self, rows):
            return ["x" for _ in rows]

    monkeypatch.setattr(validation, "translate_ids", fake_translate)
    model = torch.nn.Linear(1, 1)
    validation.validation_bleu(model, [[4, 3]], [[5, 3]], Tokenizers(), "zh", 0.7)
    scorer = validation.ValidScorer(([[4, 3]], [[5, 3]]), 100, "bleu", Tokenizers(), "zh", 1.3)
    monkeypatch.setattr(validation, "validation_loss", lambda *a: 1.0)
    scorer(model, "cpu")
    assert seen == [0.7, 1.3]


def test_a_stage_that_raises_ends_its_run_and_repro_run_failed(tmp_path, monkeypatch):
    """An error inside the stage (not a stop) marks both MLflow runs FAILED, never FINISHED or
    left RUNNING, and the error still reaches the caller."""
    import mlflow
    from mlflow import MlflowClient

    from src.core import tracking
    from src.core.errors import PipelineError

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = mlflow.get_tracking_uri()
    monkeypatch.setenv("NMT_TRACKING", "on")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("NMT_REPRO_ID", "failing-repro")
    try:
        with pytest.raises(PipelineError, match="bad input"):
            with tracking.stage_run("split", {"split": {"seed": 0}}) as run:
                assert type(run) is tracking.MlflowRun
                raise PipelineError("bad input")
        runs = MlflowClient(uri).search_runs(
            [mlflow.get_experiment_by_name(tracking.EXPERIMENT).experiment_id])
    finally:
        mlflow.set_tracking_uri(before)
    statuses = {r.data.tags.get("stage", "repro"): r.info.status for r in runs}
    assert statuses == {"split": "FAILED", "repro": "FAILED"}


def test_the_train_curve_ends_at_the_last_step():
    """A 40-step run with log_every_steps 50 wrote an empty train_curve.csv (DVC warned of
    it); a longer one ended its curve at the last multiple of 50, not at its last step."""
    from src.training.stage import train_curve_rows

    short = TrainState(step=40, last_loss=9.12345, train_seconds=4.0, tokens_seen=8000)
    assert train_curve_rows(short, lr=1e-4) == [
        {"step": 40, "loss": 9.1235, "lr": 1e-4, "tokens_per_s": 2000.0}]
    logged = {"step": 50, "loss": 8.0, "lr": 2e-4, "tokens_per_s": 1900.0}
    longer = TrainState(step=53, last_loss=7.5, train_seconds=5.0, tokens_seen=10600,
                        curve=[logged])
    assert train_curve_rows(longer, lr=3e-4)[-1]["step"] == 53
    assert train_curve_rows(TrainState(step=50, curve=[logged]), lr=0.0) == [logged]
    assert train_curve_rows(TrainState(), lr=0.0) == []


def test_a_log_that_is_not_a_terminal_gets_a_progress_line_with_the_epochs_and_runs_eta():
    from src.training.epochs import progress_line

    line = progress_line(1_200, "3/64", 300, 1_000, 4.56789, 5_432.4, "2 min 20 s",
                         "3 h 41 min")
    assert line == ("train: step 1,200, epoch 3/64 batch 300/1,000, loss 4.568, 5,432 tok/s, "
                    "epoch ETA 2 min 20 s, run ETA 3 h 41 min")


class ProductShapes(TorchDispatchMode):
    """Records the operand shapes of every matrix product run inside it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm"):
            self.seen.append(tuple(tuple(a.shape) for a in args[-2:]))
        return func(*args, **(kwargs or {}))


def projection_and_loss(hidden0, weight0, labels, fused: bool, autocast: bool):
    """Loss, NLL and the gradients of hidden and weight, through `projected_cross_entropy` or
    through the linear layer and `label_smoothed_cross_entropy` it replaces; the products."""
    from src.training.loss import label_smoothed_cross_entropy, projected_cross_entropy

    hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    with ProductShapes() as products:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = hidden.to(torch.bfloat16) if autocast else hidden
            loss, nll = (projected_cross_entropy(h, weight, labels, 0.1, rows=8) if fused
                         else label_smoothed_cross_entropy(F.linear(h, weight), labels, 0.1))
        (loss / len(labels)).backward()
    return loss.detach(), nll, hidden.grad, weight.grad, products.seen


def test_the_projection_and_loss_in_padded_chunks_give_the_unchunked_loss_and_gradients():
    """`projected_cross_entropy` (37 rows in chunks of 8, padded to 40) on fp32 inputs, where
    only the order of the sums differs: the linear layer's and `label_smoothed_cross_entropy`'s
    NLL exactly, the loss and the gradients to float rounding."""
    torch.manual_seed(3)
    args = torch.randn(37, 16), torch.randn(50, 16) * 0.3, torch.randint(0, 50, (37,))
    loss0, nll0, gh0, gw0, _ = projection_and_loss(*args, fused=False, autocast=False)
    loss1, nll1, gh1, gw1, _ = projection_and_loss(*args, fused=True, autocast=False)
    assert torch.equal(nll0, nll1)
    assert torch.allclose(loss0, loss1, rtol=1e-6)
    assert torch.allclose(gh0, gh1, rtol=1e-5, atol=1e-7)
    assert torch.allclose(gw0, gw1, rtol=1e-5, atol=1e-7)


def test_in_bf16_every_vocabulary_product_has_a_shape_that_repeats():
    """In bf16 the rows are padded to whole chunks, so the products' shapes do not depend on
    the step's token count (oneDNN builds a kernel per new shape); the gradients are the
    unpadded ones' up to bf16 rounding, and the padded rows contribute nothing."""
    torch.manual_seed(3)
    shapes = set()
    for n in (37, 35):
        args = torch.randn(n, 16), torch.randn(50, 16) * 0.3, torch.randint(0, 50, (n,))
        loss0, nll0, gh0, gw0, _ = projection_and_loss(*args, fused=False, autocast=True)
        loss1, nll1, gh1, gw1, seen = projection_and_loss(*args, fused=True, autocast=True)
        assert gh1.shape == gh0.shape and torch.allclose(gh0, gh1, rtol=0.02, atol=1e-4)
        assert torch.allclose(gw0, gw1, rtol=0.02, atol=1e-4)
        assert torch.allclose(nll0, nll1, rtol=1e-3)
        shapes |= set(seen)
    # forward and grad_hidden: 8 rows at a time; grad_weight: over the 40 padded rows
    assert shapes == {((8, 16), (16, 50)), ((8, 50), (50, 16)), ((50, 40), (40, 16))}


PACKING_BATCH = ([[5, 6, 7, 8, 9, 10, 11], [12, 13], [14]],  # 10 real source tokens of 24
                 [[15, 16, 17], [18, 19, 20, 21, 22, 23], [24]])  # 13 real target tokens of 21


def bf16_training_loss_and_grads(model, batch, packed: bool, monkeypatch=None):
    """The train stage's loss under bf16 autocast, its parameters' gradients, the products."""
    model.zero_grad()
    model.train()
    torch.manual_seed(11)  # the same dropout masks for the same shapes
    with monkeypatch.context() as patch:
        if not packed:
            patch.setattr(Transformer, "packs_rows", lambda self, device: False)
        with ProductShapes() as products:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss, _, _ = token_loss(model, batch, label_smoothing=0.1)
            loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.detach(), grads, products.seen


def test_a_bf16_training_step_runs_on_the_real_tokens_in_whole_buckets(monkeypatch):
    """In bf16 training on the CPU every linear layer reads the real tokens' rows, filled up to
    a multiple of ROW_BUCKET (10 source, 13 target -> 64 rows each), never the padded grid; it
    drops what the grid drops, so the loss and the gradients are the grid's up to bf16
    rounding. Evaluation keeps the grid."""
    from src.nmt.packing import ROW_BUCKET

    torch.manual_seed(5)
    model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=2, ffn_dim=32,
                                    dropout=0.3))
    batch = make_batch(*PACKING_BATCH, max_positions=16)
    assert batch.src.numel() == 24 and batch.tgt_in.numel() == 21
    loss0, grads0, grid = bf16_training_loss_and_grads(model, batch, False, monkeypatch)
    loss1, grads1, rows = bf16_training_loss_and_grads(model, batch, True, monkeypatch)
    assert torch.allclose(loss0, loss1, rtol=1e-3)
    for name, grad in grads0.items():
        assert torch.allclose(grad, grads1[name], rtol=0.03, atol=2e-3), name
    # the linear layers' forward products, (rows, 16) x (16, out); the loss's are (256, 16)
    linear_rows = {a[0] for a, b in rows if a[1] == 16 and a[0] != 256}
    assert linear_rows == {ROW_BUCKET}
    assert {a[0] for a, b in grid if a[1] == 16 and a[0] != 256} == {24, 21}
    model.eval()
    with ProductShapes() as products, torch.autocast("cpu", dtype=torch.bfloat16):
        token_loss(model, batch, label_smoothing=0.1)
    assert {a[0] for a, b in products.seen if a[1] == 16 and a[0] != 256} == {24, 21}


def test_packed_rows_move_real_tokens_and_only_their_gradients():
    from src.nmt.packing import ROW_BUCKET, PackedRows

    real = torch.tensor([[True, True, True], [True, False, False]])
    packing = PackedRows(real)
    assert packing.positions.tolist() == [0, 1, 2, 3] and packing.n_real == 4
    assert packing.rows.tolist() == [0, 1, 2, 3] + [0] * (ROW_BUCKET - 4)
    assert packing.pe_rows()[:4].tolist() == [0, 1, 2, 0]
    grid = torch.arange(6.0).view(2, 3, 1).expand(2, 3, 2).clone().requires_grad_()
    rows = packing.pack(grid)
    assert rows.shape == (ROW_BUCKET, 2) and rows[:4, 0].tolist() == [0, 1, 2, 3]
    back = packing.unpack(rows)
    assert torch.equal(back[real], grid[real].detach())
    (back * torch.arange(1.0, 13.0).view(2, 3, 2)).sum().backward()
    # real positions get their own gradient; pad positions none (attention never lets one
    # reach them), where plain indexing would have summed every pad position into row 0
    assert grid.grad.view(6, 2).tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [0, 0], [0, 0]]


def test_no_gradient_but_exact_zeros_reaches_filler_rows_or_pad_positions(monkeypatch):
    """The packed step's backward leaves out what reaches filler rows and pad positions (see
    src/nmt/packing.py); plain indexing, which sums it all in, gives the same gradients bit for
    bit, dropout included: what was left out was exact zeros."""
    from src.nmt import packing as packing_module

    torch.manual_seed(5)
    model = Transformer(ModelConfig(30, 30, d_model=16, n_heads=2, n_layers=2, ffn_dim=32,
                                    dropout=0.3))
    batch = make_batch(*PACKING_BATCH, max_positions=16)
    _, ours, _ = bf16_training_loss_and_grads(model, batch, True, monkeypatch)
    monkeypatch.setattr(packing_module.PackedRows, "pack", lambda self, grid: grid.reshape(
        self.batch * self.length, -1).index_select(0, self.rows))
    monkeypatch.setattr(packing_module.PackedRows, "unpack", lambda self, rows: rows.index_select(
        0, self.gather).view(self.batch, self.length, -1))
    _, summed, _ = bf16_training_loss_and_grads(model, batch, True, monkeypatch)
    for name, grad in ours.items():
        assert torch.equal(grad, summed[name]), name
