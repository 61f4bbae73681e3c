"""Toy projects the slow tests share, each built once per pytest run (tests/conftest.py) or by
a module that needs its own: a tiny Transformer trained in process on the toy corpus, with its
tokenizer, test and valid splits, and `src.export`'s files; a parent trained by the train stage
and a child project that fine-tunes from it (train.init_from)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from helpers import TINY_PARAMS, run_stage, scratch_root, set_train_params
from toy_corpus import toy_pairs, toy_tsv

from src.data.batching import make_batch
from src.data.subword import ENCODED_WITH, META, tokenizer_digest, train_spm
from src.nmt import checkpoint
from src.nmt.model import ModelConfig, Transformer

MAX_POSITIONS = 48
EXPORT = {"parity_sentences": 60, "batch_size": 16, "beam_size": 3, "quantize": True}


def train_tiny(sp, pairs: list[tuple[str, str]], steps: int = 150) -> Transformer:
    """d_model 32, 2 encoder layers and 1 decoder layer (unequal, so no exporter may assume the
    stacks match), trained just enough to emit EOS and real words. On one thread whatever the
    caller set: sums split over threads round differently, and another model could miss the
    export's int8 gate (test_serving.py run alone trained on two and did)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_tiny(sp, pairs, steps)
    finally:
        torch.set_num_threads(before)


def _train_tiny(sp, pairs: list[tuple[str, str]], steps: int) -> Transformer:
    torch.manual_seed(0)
    vocab = sp.get_piece_size()
    model = Transformer(ModelConfig(vocab, vocab, d_model=32, n_heads=4, n_layers=2, ffn_dim=64,
                        dropout=0.0, max_positions=MAX_POSITIONS, share_source_embedding=True,
                        decoder_layers=1))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    src, tgt = sp.encode([e for e, _ in pairs]), sp.encode([z for _, z in pairs])
    rng = random.Random(0)
    for _ in range(steps):
        idx = rng.sample(range(len(pairs)), 48)
        batch = make_batch([src[i] for i in idx], [tgt[i] for i in idx], MAX_POSITIONS)
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def write_tokenizer(directory: Path, model_bytes: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "source.model").write_bytes(model_bytes)
    (directory / "target.model").write_bytes(model_bytes)
    (directory / META).write_text(json.dumps({"source_lang": "en", "target_lang": "zh",
                                              "shared_vocab": True, "pad_id": 0, "unk_id": 1,
                                              "bos_id": 2, "eos_id": 3}))


def exported_project(directory: Path, tracking: bool = False,
                     files: dict[str, str] | None = None) -> Path:
    """A scratch project root with tokenizer, model.pt and a test split (and `files`, relative
    path -> text, e.g. evaluate's metrics), then `src.export` (logged to the project's
    mlflow.db when `tracking`)."""
    import sentencepiece as spm
    from datasets import Dataset, DatasetDict

    pairs = toy_pairs()
    random.Random(0).shuffle(pairs)
    test, train = pairs[:80], pairs[80:]
    valid = train[:40]  # fits the confidence curve (trained on, for a fixture that is enough)
    spm_bytes = train_spm([s for p in train for s in p], vocab_size=120, model_type="unigram",
                          character_coverage=1.0, byte_fallback=False, seed=0)
    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    root = scratch_root(directory, export=EXPORT)
    write_tokenizer(root / "models" / "tokenizer", spm_bytes)
    model = train_tiny(sp, train)
    checkpoint.save(checkpoint.model_state(model), root / "models" / "model.pt")
    columns = {"source": [e for e, _ in test], "target": [z for _, z in test]}
    columns |= {"source_ids": sp.encode(columns["source"]),
                "target_ids": sp.encode(columns["target"])}
    valid_columns = {"source": [e for e, _ in valid], "target": [z for _, z in valid]}
    valid_columns |= {"source_ids": sp.encode(valid_columns["source"]),
                      "target_ids": sp.encode(valid_columns["target"])}
    DatasetDict({"test": Dataset.from_dict(columns), "valid": Dataset.from_dict(valid_columns)}
                ).save_to_disk(str(root / "data/tokenized"))
    stamp = tokenizer_digest(root / "models/tokenizer")
    (root / "data/tokenized" / ENCODED_WITH).write_text(stamp)
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    result = run_stage(root, "export", tracking=tracking)
    assert result.returncode == 0, result.stderr
    return root


# train.* for the fine-tune projects: one thread, the plain corpus, one direction
FINETUNE_TRAIN = {"max_tokens": 1000, "warmup_steps": 5, "log_every_steps": 5, "threads": 1,
                  "average_best": 1, "concat_ratio": 0.0, "bidirectional_epochs": 0}


def set_params(root: Path, **sections) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in sections.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def toy_project(root: Path, keep=lambda i: True, **overrides) -> Path:
    """The toy corpus (the lines `keep` picks) downloaded and split, tiny params."""
    sections = {**TINY_PARAMS, **overrides}
    sections["train"] = {**FINETUNE_TRAIN, **sections.get("train", {})}
    root = scratch_root(root, **sections)
    lines = toy_tsv().splitlines(keepends=True)
    (root / "toy.tsv").write_text("".join(ln for i, ln in enumerate(lines) if keep(i)),
                                  encoding="utf-8")
    set_params(root, download={"url": str(root / "toy.tsv")})
    for stage in ("download", "split"):
        result = run_stage(root, stage)
        assert result.returncode == 0, result.stderr
    return root


def trained_parent(root: Path) -> Path:
    """A tiny model trained by the train stage on every other toy pair."""
    toy_project(root, keep=lambda i: i % 2 == 0)
    assert run_stage(root, "tokenize").returncode == 0
    set_train_params(root, max_steps=60, epochs=100)
    result = run_stage(root, "train")
    assert result.returncode == 0, result.stderr
    return root


def child_of(root: Path, init_from: str, **overrides) -> Path:
    """All the toy pairs (half of them new to the parent), starting from `init_from`."""
    toy_project(root, **overrides)
    set_params(root, train={"init_from": init_from, "max_steps": 40},
               finetune={"lr": 0.001, "warmup_steps": 5, "epochs": 100,
                         "bidirectional_epochs": 0})
    return root


def resolve_and_tokenize(root: Path) -> Path:
    """The parent stage resolves train.init_from, then tokenize encodes with its tokenizer."""
    for stage in ("parent", "tokenize"):
        result = run_stage(root, stage)
        assert result.returncode == 0, result.stderr
    return root
