"""train.precision: which arithmetic a step runs in, what stays fp32, and what it does to resume;
the fused label-smoothed loss and the training attention that bf16 steps go through."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_PARAMS, train_cfg

from src.data.batching import make_batch, token_batches
from src.nmt import model as model_module
from src.nmt.model import ModelConfig, Transformer, attention_with_dropout, padding_mask
from src.training import precision as precision_module
from src.training.distributed import World
from src.training.loss import label_smoothed_cross_entropy
from src.training.precision import Precision, cpu_bf16_feature, resolve_precision
from src.training.resume import ResumeStore
from src.training.step import Trainer

CPU = torch.device("cpu")


def fake_cpu(monkeypatch, feature: str) -> None:
    monkeypatch.setattr(precision_module, "cpu_bf16_feature", lambda: feature)


@pytest.mark.parametrize("feature", ["AMX", "AVX-512 BF16"])
def test_auto_trains_in_bf16_where_the_cpu_multiplies_bf16(monkeypatch, feature):
    fake_cpu(monkeypatch, feature)
    precision, warning = resolve_precision("auto", CPU)
    assert (precision.name, warning) == ("bf16", "")
    assert feature in precision.reason and precision.autocast_dtype == torch.bfloat16
    assert not precision.needs_scaler
    assert resolve_precision("fp32", CPU)[0].name == "fp32"


def test_auto_trains_in_fp32_on_a_cpu_without_native_bf16(monkeypatch):
    fake_cpu(monkeypatch, "")
    precision, warning = resolve_precision("auto", CPU)
    assert (precision.name, warning) == ("fp32", "")
    assert "neither AMX nor AVX-512 BF16" in precision.reason
    assert precision.autocast_dtype is None


def test_bf16_asked_for_without_native_bf16_says_so_in_one_line_and_trains_fp32(monkeypatch):
    fake_cpu(monkeypatch, "")
    precision, warning = resolve_precision("bf16", CPU)
    assert precision.name == "fp32"
    assert "\n" not in warning and "AVX-512 BF16" in warning and "fp32" in warning


@pytest.mark.parametrize("requested, gpu_bf16, name, warning", [
    ("auto", True, "tf32", ""),
    ("auto", False, "tf32", ""),
    ("bf16", True, "bf16", ""),
    ("bf16", False, "fp16",
     "train.precision bf16: this GPU has no bf16, training in fp16 with a scaler"),
    ("fp32", True, "fp32", ""),
])
def test_on_a_gpu_auto_is_tf32_and_bf16_is_autocast_or_fp16_with_a_loss_scaler(
        monkeypatch, requested, gpu_bf16, name, warning):
    """The CUDA branch's choice, with the GPU faked (no GPU here): the CPU's features never
    count on a GPU, only fp16 needs the gradient scaler, and only bf16/fp16 autocast."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: gpu_bf16)
    fake_cpu(monkeypatch, "AMX")  # must not matter
    precision, said = resolve_precision(requested, torch.device("cuda", 0))
    assert (precision.name, precision.device_type, said) == (name, "cuda", warning)
    assert precision.needs_scaler == (name == "fp16")
    assert precision.autocast_dtype == {"bf16": torch.bfloat16,
                                        "fp16": torch.float16}.get(name)


@pytest.mark.parametrize("name, switch", [("tf32", "tf32"), ("fp32", "ieee"), ("bf16", "ieee")])
def test_tf32_turns_cudas_fp32_matmuls_to_tensor_cores_and_the_rest_turn_them_back(
        monkeypatch, name, switch):
    matmul, conv = SimpleNamespace(fp32_precision="none"), SimpleNamespace(fp32_precision="none")
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)  # the process's own stay as set
    monkeypatch.setattr(torch.backends.cudnn, "conv", conv)
    Precision(name, "cuda", "").set_matmul_precision()
    assert (matmul.fp32_precision, conv.fp32_precision) == (switch, switch)
    Precision("tf32", "cpu", "").set_matmul_precision()  # a CPU step leaves CUDA's alone
    assert (matmul.fp32_precision, conv.fp32_precision) == (switch, switch)


def test_the_cpu_feature_comes_from_torchs_checks_amx_first(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert cpu_bf16_feature() == "AMX"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert cpu_bf16_feature() == "AVX-512 BF16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert cpu_bf16_feature() == ""


def tiny_model(dropout: float = 0.0) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(40, 40, d_model=16, n_heads=2, n_layers=1, ffn_dim=32,
                                   dropout=dropout, share_source_embedding=True))


BATCH = ([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15, 16, 17]])


def test_a_bf16_step_runs_matmuls_in_bf16_and_keeps_weights_norms_and_loss_in_fp32(tmp_path):
    model = tiny_model()
    seen: dict[str, set] = {"linear": set(), "norm": set()}
    for module in model.modules():
        kind = ("linear" if isinstance(module, torch.nn.Linear)
                else "norm" if isinstance(module, torch.nn.LayerNorm) else "")
        if kind:
            module.register_forward_hook(lambda m, i, out, kind=kind: seen[kind].add(out.dtype))
    store = ResumeStore(tmp_path, {}, "")
    trainer = Trainer(model, train_cfg(), CPU, 10, store, 1,
                      precision=Precision("bf16", "cpu", "test"))
    loss, _ = trainer.step([make_batch(*BATCH, max_positions=16)])
    assert seen == {"linear": {torch.bfloat16}, "norm": {torch.float32}}
    assert math.isfinite(loss)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad is None for p in model.parameters()} == {True}  # stepped and zeroed
    moments = [t for s in trainer.optimizer.state.values() for t in s.values() if t.dim()]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    trainer.save_last()
    saved = torch.load(store.last, weights_only=True)["model"]
    assert {t.dtype for t in saved.values() if t.is_floating_point()} == {torch.float32}


def test_one_cast_per_sublayer_gives_the_linears_the_bits_autocast_would(monkeypatch):
    model = tiny_model().eval()
    batch = make_batch(*BATCH, max_positions=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = model(batch.src, batch.tgt_in)
        monkeypatch.setattr(model_module, "matmul_input", lambda x: x)
        autocasts = model(batch.src, batch.tgt_in)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, autocasts)


def test_training_attention_is_sdpa_when_nothing_is_dropped():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, n, 8) for n in (3, 5, 5))
    mask = padding_mask(torch.tensor([[4, 4, 4, 0, 0], [4, 4, 4, 4, 4]]))
    ours = attention_with_dropout(q, k, v, mask, 0.0)
    assert torch.allclose(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                          atol=1e-6)


def test_training_attention_drops_whole_weights_and_rescales_the_rest():
    torch.manual_seed(2)
    q, k = torch.randn(1, 1, 400, 8), torch.randn(1, 1, 6, 8)
    v = torch.eye(6)[None, None]  # output row = the (dropped, rescaled) attention weights
    weights = attention_with_dropout(q, k, v, None, 0.25)
    kept = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) / 0.75
    dropped = weights == 0
    assert torch.allclose(weights[~dropped], kept[~dropped], atol=1e-6)
    assert 0.2 < dropped.float().mean().item() < 0.3


def test_the_fused_loss_matches_hand_computed_values_in_fp32_and_bf16():
    # V = 3, x = (0, 0, ln 2), gold 2: softmax (1/4, 1/4, 1/2), lse = ln 4
    x = torch.tensor([[0.0, 0.0, math.log(2.0)]])
    eps = 0.1
    want_loss = (1 - eps) * math.log(2) + eps * (math.log(4) - math.log(2) / 3)
    want_grad = [0.25 - eps / 3, 0.25 - eps / 3, 0.5 - (1 - eps) - eps / 3]
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        logits = x.to(dtype).detach().requires_grad_()
        loss, nll = label_smoothed_cross_entropy(logits, torch.tensor([2]), eps)
        (2 * loss).backward()
        assert loss.dtype == torch.float32 and not nll.requires_grad
        assert loss.item() == pytest.approx(want_loss, abs=tol)
        assert nll.item() == pytest.approx(math.log(2), abs=tol)
        assert logits.grad.dtype == dtype
        assert logits.grad.float()[0].tolist() == pytest.approx([2 * g for g in want_grad],
                                                                abs=tol)


def test_length_multiple_pads_widths_and_batches_stay_within_the_budget():
    src_lens = [3, 10, 4, 25, 7, 7, 1, 12] * 20
    tgt_lens = [2, 9, 5, 20, 6, 8, 1, 11] * 20
    batches = token_batches(src_lens, tgt_lens, 200, seed=3, length_multiple=8)
    assert sorted(i for b in batches for i in b) == list(range(len(src_lens)))
    for b in batches:
        width = (-(-(max(src_lens[i] for i in b) + 1) // 8) * 8
                 + -(-(max(tgt_lens[i] for i in b) + 1) // 8) * 8)
        assert len(b) == 1 or len(b) * width <= 200
    batch = make_batch([[5] * 9, [6]], [[7] * 3, [8]], max_positions=64, length_multiple=8)
    assert batch.src.shape == (2, 16) and batch.tgt_in.shape == batch.tgt_out.shape == (2, 8)
    assert batch.n_tokens == (10 + 2) + (4 + 2)  # padding is not counted as tokens
    capped = make_batch([[5] * 9], [[7] * 3], max_positions=12, length_multiple=8)
    assert capped.src.shape == (1, 12)  # 9 + EOS padded to 16, then cut to max_positions


# -- the train stage, in process (so the CPU can be faked) -----------------------------------


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    from helpers import tokenize_toy

    return tokenize_toy(tmp_path_factory.mktemp("precision"), **TINY_PARAMS)


def train_in_process(root, monkeypatch, feature: str, **train):
    from src.core.params import ModelParams
    from src.training.stage import train as train_stage

    fake_cpu(monkeypatch, feature)
    model_params = ModelParams(d_model=64, n_heads=4, n_layers=2, ffn_dim=128, dropout=0.0,
                               pre_norm=True, max_positions=64, tie_embeddings=True,
                               decoder_layerdrop=0.0, decoder_layers=0)
    cfg = train_cfg(**{"lr": 3e-3, "warmup_steps": 30, "max_tokens": 1500, "threads": 1,
                       "select_by": "bleu", "log_every_steps": 10, "precision": "auto"} | train)
    models = root / "models"
    train_stage(World(), model_params, cfg, root / "data/tokenized", models / "tokenizer",
                models / "checkpoints", models / "model.pt",
                (models / "train_metrics.json", models / "train_stats.json"), 1000)
    return json.loads((models / "train_stats.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("feature, precision, says", [
    ("AVX-512 BF16", "bf16", "bf16 (train.precision auto: the CPU has AVX-512 BF16)"),
    ("", "fp32", "fp32 (auto: the CPU has neither AMX nor AVX-512 BF16)")])
def test_a_tiny_model_trained_by_the_train_stage_learns(toy_data, monkeypatch, capsys,
                                                         feature, precision, says):
    """A quality floor on the train stage itself (tests/test_learns.py has its own loop): 200
    steps on the toy corpus reach a greedy valid BLEU above 80 in either precision."""
    import shutil

    shutil.rmtree(toy_data / "models/checkpoints", ignore_errors=True)
    stats = train_in_process(toy_data, monkeypatch, feature, epochs=60, max_steps=200)
    assert says in capsys.readouterr().out
    assert stats["precision"] == precision and stats["steps"] == 200
    assert stats["valid_bleu"] > 80, stats


@pytest.mark.slow
def test_a_resume_under_another_precision_is_refused_and_named(toy_data, monkeypatch, capsys):
    import shutil

    shutil.rmtree(toy_data / "models/checkpoints", ignore_errors=True)
    train_in_process(toy_data, monkeypatch, "", epochs=1, max_steps=3)  # auto -> fp32
    capsys.readouterr()
    stats = train_in_process(toy_data, monkeypatch, "AMX", epochs=1, max_steps=6)
    err = capsys.readouterr().err
    assert "cannot be resumed (params changed: train.precision 'fp32' -> 'bf16')" in err
    assert "moved it to" in err and stats["steps"] == 6 and stats["precision"] == "bf16"
    assert list(toy_data.glob("models/checkpoints.old-*"))
