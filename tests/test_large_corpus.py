"""The paths a large corpus takes, on data small enough for CI: encoding in worker processes,
token ids read from Arrow without per-sentence Python lists, the split left untouched."""

from __future__ import annotations

import pyarrow as pa
import pytest
from helpers import TINY_PARAMS, tokenize_toy


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    return tokenize_toy(tmp_path_factory.mktemp("large"), **TINY_PARAMS)


def test_ragged_column_reads_every_chunk_and_slice():
    from src.data.batching import ragged_column

    rows = [[5, 6, 7], [], [8], [9, 10], [11, 12, 13, 14]]
    whole = pa.array(rows, type=pa.list_(pa.int64()))
    # a multi-shard dataset gives several chunks; a sliced chunk has offsets not starting at 0
    column = pa.chunked_array([whole.slice(0, 2), whole.slice(2, 3)])
    ragged = ragged_column(column)
    assert ragged.tolist() == rows
    assert ragged.lengths().tolist() == [3, 0, 1, 2, 4]
    assert ragged_column(pa.chunked_array([], type=pa.list_(pa.int64()))).tolist() == []


def test_load_encoded_gives_the_ids_tokenize_wrote(toy_root):
    from datasets import load_from_disk

    from src.data.batching import load_encoded

    dataset = load_from_disk(str(toy_root / "data/tokenized"))
    for split in ("train", "valid"):
        sources, targets = load_encoded(toy_root / "data/tokenized", split)
        assert sources.tolist() == dataset[split]["source_ids"]
        assert targets.tolist() == dataset[split]["target_ids"]


def test_encoding_in_worker_processes_equals_encoding_in_one(toy_root, tmp_path, monkeypatch):
    from datasets import load_from_disk

    from src.data import encoding

    split = load_from_disk(str(toy_root / "data/split"))["train"]
    tokenizer = toy_root / "models/tokenizer"
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    serial = encoding.encode_split(split, "train", tokenizer, tmp_path / "one", 1)
    monkeypatch.setattr(encoding, "PARALLEL_FROM", 0)
    parallel = encoding.encode_split(split, "train", tokenizer, tmp_path / "two", 2)
    assert len(list((tmp_path / "two").glob("*.arrow"))) == 2  # really two workers
    assert parallel.to_dict() == serial.to_dict()


def test_tokenize_writes_nothing_into_the_split(toy_root):
    """datasets caches map() results beside its input by default, which would change
    data/split (an output of the split stage) behind DVC's back."""
    files = sorted(p.name for p in (toy_root / "data/split").rglob("*"))
    assert not [name for name in files if name.startswith("cache-")], files
    assert not list((toy_root / "data").glob(".tokenize-*"))  # the scratch folder is gone


def test_the_per_epoch_weights_come_through_encoding_to_the_train_stage(toy_root, tmp_path):
    """split's `drawn_weight` column (a corpus weighted per epoch) survives tokenize's
    encoding and is what train reads; a corpus without one reads as None."""
    import numpy as np
    from datasets import DatasetDict, load_from_disk

    from src.data import encoding
    from src.data.batching import load_drawn_weight

    split = load_from_disk(str(toy_root / "data/split"))["train"]
    weights = np.where(np.arange(len(split)) % 3 == 0, 0.25, 0.0).astype(np.float32)
    marked = split.add_column("drawn_weight", weights.tolist())
    encoded = encoding.encode_split(marked, "train", toy_root / "models/tokenizer", tmp_path, 1)
    DatasetDict({"train": encoded}).save_to_disk(str(tmp_path / "tokenized"))
    assert load_drawn_weight(tmp_path / "tokenized").tolist() == weights.tolist()
    assert load_drawn_weight(toy_root / "data/tokenized") is None


def test_the_tokenizer_learns_a_per_epoch_corpus_at_its_weight(tmp_path, monkeypatch):
    """A dictionary weighted per epoch feeds SentencePiece as one epoch shows it to the model
    (a quarter here), every other pair whole: at full size its entries would outnumber the
    sentences and take the vocabulary from them."""
    from datasets import Dataset, DatasetDict

    from src.data import encoding

    sentences = [f"sentence {i}" for i in range(10)]
    words = [f"word{i}" for i in range(40)]
    DatasetDict({"train": Dataset.from_dict({
        "source": sentences + words, "target": ["句"] * 10 + ["词"] * 40,
        "drawn_weight": [0.0] * 10 + [0.25] * 40})}).save_to_disk(str(tmp_path / "split"))
    fed: list[list[str]] = []
    monkeypatch.setattr(encoding, "train_spm", lambda lines, **options: fed.append(list(lines)))
    for seed in (0, 0, 1):
        encoding.learn_model(str(tmp_path / "split"), ("source",), {"seed": seed})
    assert all(got[:10] == sentences and len(got) == 20 for got in fed)
    assert set(fed[0][10:]) < set(words) and len(set(fed[0][10:])) == 10
    assert fed[0] == fed[1] and fed[0] != fed[2]  # the draw is the seed's
