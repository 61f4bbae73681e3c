"""tokenize: data/split -> models/tokenizer/ (SentencePiece) + data/tokenized (token ids).

The `tokenize` stage lives in `tokenize_corpus.py` because a module named `tokenize` would
shadow the standard library's (which `linecache` and `inspect` import) whenever `src/` is on
sys.path.

Reads params `pair.*` and `tokenize.*`. The tokenizer is trained on the *train* split only
(one shared model for both sides, or one per side), then every split is encoded. Vocabulary
size, unknown-token rate and length statistics go to data/tokenize_metrics.json.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import typer

from src import paths, tracking
from src.atomic import atomic_dir, write_json
from src.errors import require_file, run_cli
from src.params import PairParams, TokenizeParams, load_params
from src.subword import (
    BOS,
    ENCODED_WITH,
    EOS,
    META,
    PAD,
    UNK,
    load_tokenizers,
    tokenizer_digest,
    train_spm,
)

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def write_tokenizers(train, pair: PairParams, cfg: TokenizeParams, out_dir: Path) -> None:
    options = dict(
        vocab_size=cfg.vocab_size,
        model_type=cfg.model_type,
        character_coverage=cfg.character_coverage,
        byte_fallback=cfg.byte_fallback,
        normalization=cfg.normalization,
        seed=cfg.seed,
    )
    with atomic_dir(out_dir) as tmp:
        if cfg.shared_vocab:
            model = train_spm(list(train["source"]) + list(train["target"]), **options)
            (tmp / "source.model").write_bytes(model)
            (tmp / "target.model").write_bytes(model)
        else:
            (tmp / "source.model").write_bytes(train_spm(list(train["source"]), **options))
            (tmp / "target.model").write_bytes(train_spm(list(train["target"]), **options))
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


def length_stats(rows: list[list[int]], prefix: str) -> dict[str, float]:
    lengths = sorted(len(r) for r in rows) or [0]
    return {
        f"{prefix}_len_mean": round(statistics.fmean(lengths), 2),
        f"{prefix}_len_p95": lengths[int(0.95 * (len(lengths) - 1))],
        f"{prefix}_len_max": lengths[-1],
    }


def unk_rate(rows: list[list[int]]) -> float:
    total = sum(len(r) for r in rows)
    return sum(r.count(UNK) for r in rows) / max(total, 1)


@app.command()
def main(
    split_dir: Path = typer.Option(paths.SPLIT, help="DatasetDict from `split`."),
    tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir to write."),
    out_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded DatasetDict to write."),
    metrics: Path = typer.Option(paths.TOKENIZE_METRICS, help="Stats JSON to write."),
) -> None:
    """Train SentencePiece on the train split (params `tokenize.*`) and encode all splits."""
    from datasets import DatasetDict, disable_progress_bars, load_from_disk

    disable_progress_bars()
    pair = load_params(PairParams)
    cfg = load_params(TokenizeParams)
    require_file(split_dir, "split")
    params = {"pair": pair.model_dump(), "tokenize": cfg.model_dump()}
    with tracking.stage_run("tokenize", params, deps=[split_dir]) as run:
        splits = load_from_disk(str(split_dir))
        write_tokenizers(splits["train"], pair, cfg, tokenizer_dir)
        tok = load_tokenizers(tokenizer_dir)
        stats: dict[str, float] = {
            "source_vocab": tok.source_vocab,
            "target_vocab": tok.target_vocab,
        }
        encoded = {}
        for name, part in splits.items():
            src = tok.source.encode(list(part["source"]))
            tgt = tok.target.encode(list(part["target"]))
            encoded[name] = part.add_column("source_ids", src).add_column("target_ids", tgt)
            stats[f"{name}_unk_rate"] = round(unk_rate(src + tgt), 6)
            if name == "train":
                stats.update(length_stats(src, "source"))
                stats.update(length_stats(tgt, "target"))
        with atomic_dir(out_dir) as tmp:
            DatasetDict(encoded).save_to_disk(str(tmp))
            (tmp / ENCODED_WITH).write_text(tokenizer_digest(tokenizer_dir) + "\n")
        write_json(metrics, stats)
        run.log_metrics(stats)
        run.log_artifacts(tokenizer_dir, "tokenizer")
    print("tokenize: " + ", ".join(f"{k} {v}" for k, v in stats.items()))


if __name__ == "__main__":
    run_cli(app)
