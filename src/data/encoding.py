"""Training the SentencePiece models on the train split and encoding every split into Arrow files,
in worker processes for large corpora, with length and unk statistics (the tokenize stage's
work)."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np

from src.core.atomic import atomic_dir, write_json
from src.core.params import PairParams, TokenizeParams
from src.data.corpus_weights import epoch_rows
from src.data.subword import (
    BOS,
    EOS,
    META,
    PAD,
    UNK,
    Tokenizers,
    load_tokenizers,
    tokenizer_digest,
    train_spm,
)

# Below this many pairs a split is encoded in this process: starting workers costs more.
PARALLEL_FROM = 50_000
ENCODE_BATCH = 2_000


def sentences(part, column: str, batch_size: int = 10_000):
    """The sentences of one column, read from Arrow a batch at a time."""
    for batch in part.iter(batch_size=batch_size):
        yield from batch[column]


def learn_model(split_dir: str, columns: tuple[str, ...], options: dict) -> bytes:
    """A SentencePiece model learnt from the train split's `columns`, streamed from Arrow.

    A corpus weighted per epoch (`drawn_weight`, a dictionary) enters at its weight, as one
    epoch shows it to the model (a draw seeded by `seed`): at full size CC-CEDICT's 172k
    entries would outnumber the 26k sentences and take the vocabulary from them (sentences
    came out 55% more pieces long)."""
    from datasets import load_from_disk

    train = load_from_disk(split_dir)["train"]
    if "drawn_weight" in train.column_names:
        train = train.select(epoch_rows(train.data.column("drawn_weight").to_numpy(),
                                        ("tokenize", options["seed"])))
    return train_spm(itertools.chain(*(sentences(train, c) for c in columns)), **options)


def in_child_process(fn, *args):
    """fn(*args) in a child process: SentencePiece's peak memory (its sentence sample and
    suffix array) is returned to the system when the child ends, instead of staying in this
    process while the encoding workers start."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
        return pool.submit(fn, *args).result()


def write_tokenizers(split_dir: Path, pair: PairParams, cfg: TokenizeParams,
                     out_dir: Path) -> None:
    options = dict(
        vocab_size=cfg.vocab_size,
        model_type=cfg.model_type,
        character_coverage=cfg.character_coverage,
        byte_fallback=cfg.byte_fallback,
        normalization=cfg.normalization,
        seed=cfg.seed,
        max_sentences=cfg.max_sentences,
    )
    with atomic_dir(out_dir) as tmp:
        if cfg.shared_vocab:
            model = in_child_process(learn_model, str(split_dir), ("source", "target"), options)
            (tmp / "source.model").write_bytes(model)
            (tmp / "target.model").write_bytes(model)
        else:
            for side in ("source", "target"):
                model = in_child_process(learn_model, str(split_dir), (side,), options)
                (tmp / f"{side}.model").write_bytes(model)
        meta = {
            "source_lang": pair.source_lang,
            "target_lang": pair.target_lang,
            "shared_vocab": cfg.shared_vocab,
            "pad_id": PAD,
            "unk_id": UNK,
            "bos_id": BOS,
            "eos_id": EOS,
        }
        write_json(tmp / META, meta)


_tokenizers: dict[str, Tokenizers] = {}


def encode_batch(batch: dict, tokenizer_dir: str) -> dict:
    """datasets.map function; each worker process loads the tokenizer once."""
    if tokenizer_dir not in _tokenizers:
        _tokenizers[tokenizer_dir] = load_tokenizers(Path(tokenizer_dir))
    tok = _tokenizers[tokenizer_dir]
    return {"source_ids": tok.source.encode(batch["source"]),
            "target_ids": tok.target.encode(batch["target"])}


def encode_split(part, name: str, tokenizer_dir: Path, work_dir: Path, num_proc: int):
    from datasets import disable_progress_bars, enable_progress_bars

    large = len(part) >= PARALLEL_FROM
    (enable_progress_bars if large else disable_progress_bars)()
    # datasets would fingerprint the result by hashing fn_kwargs, whose absolute tokenizer
    # path differs between clones; DVC hashes the fingerprint (state.json) with the data, so
    # identical ids would get a new hash in every checkout. Input + tokenizer say it all.
    fingerprint = hashlib.sha256(
        f"{part._fingerprint} {tokenizer_digest(tokenizer_dir)} {name}".encode()).hexdigest()
    return part.map(
        encode_batch,
        batched=True,
        batch_size=ENCODE_BATCH,
        num_proc=num_proc if large and num_proc > 1 else None,
        fn_kwargs={"tokenizer_dir": str(tokenizer_dir)},
        # Written to a scratch folder: by default datasets caches beside its input, which
        # here is data/split, an output of the previous stage.
        cache_file_name=str(work_dir / f"{name}.arrow"),
        load_from_cache_file=False,
        new_fingerprint=fingerprint[:16],
        desc=f"tokenize: encoding {name}",
    )


def column_lengths(part, column: str) -> np.ndarray:
    import pyarrow.compute as pc

    chunks = part.data.column(column).chunks
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([pc.list_value_length(c).to_numpy(zero_copy_only=False)
                           for c in chunks]).astype(np.int64)


def column_count(part, column: str, token_id: int) -> int:
    import pyarrow.compute as pc

    return sum(int(pc.sum(pc.equal(pc.list_flatten(c), token_id)).as_py() or 0)
               for c in part.data.column(column).chunks)


def length_stats(lengths: np.ndarray, prefix: str) -> dict[str, float]:
    ordered = np.sort(lengths) if len(lengths) else np.zeros(1, dtype=np.int64)
    return {
        f"{prefix}_len_mean": round(float(ordered.mean()), 2),
        f"{prefix}_len_p95": int(ordered[int(0.95 * (len(ordered) - 1))]),
        f"{prefix}_len_max": int(ordered[-1]),
    }


def unk_rate(part) -> float:
    total = sum(int(column_lengths(part, c).sum()) for c in ("source_ids", "target_ids"))
    unk = sum(column_count(part, c, UNK) for c in ("source_ids", "target_ids"))
    return unk / max(total, 1)
