"""tokenize: data/split -> models/tokenizer/ (SentencePiece) + data/tokenized (token ids).

The `tokenize` stage lives in `tokenize_corpus.py` because a module named `tokenize` would
shadow the standard library's (which `linecache` and `inspect` import) whenever `src/` is on
sys.path.

Reads params `pair.*` and `tokenize.*`. The tokenizer is trained on the *train* split only
(one shared model for both sides, or one per side) from a stream of its sentences, sampled down
to `tokenize.max_sentences` — or, when train.init_from names a parent model, the parent's
tokenizer byte for byte (models/parent/tokenizer: a trained model keeps its vocabulary, and the
other tokenize.* params do not apply); then every split is encoded with `datasets.map` (batched, in
`tokenize.num_proc` processes for large splits) straight into Arrow files, so no stage holds
the corpus as Python lists. Vocabulary size, unknown-token rate and length statistics go to
data/tokenize_stats.json (and MLflow).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from src.core import paths, tracking
from src.core.atomic import atomic_dir, write_json
from src.core.cli import run_cli
from src.core.cpus import usable_cpus
from src.core.errors import require_file
from src.core.params import PairParams, TokenizeParams, load_params
from src.data.encoding import (
    column_lengths,
    encode_split,
    length_stats,
    unk_rate,
    write_tokenizers,
)
from src.data.subword import (
    ENCODED_WITH,
    load_tokenizers,
    tokenizer_digest,
)
from src.training.init_from import parent_record, reuse_tokenizer

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    split_dir: Path = typer.Option(paths.SPLIT, help="DatasetDict from `split`."),
    tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir to write."),
    out_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded DatasetDict to write."),
    stats_path: Path = typer.Option(paths.TOKENIZE_STATS, "--stats", help="Stats JSON to write."),
    parent_dir: Path = typer.Option(paths.PARENT, help="The parent stage's folder (a parent "
                                    "model's tokenizer is reused)."),
) -> None:
    """Train SentencePiece on the train split (params `tokenize.*`, languages from `pair.*`) and
    encode all splits."""
    pair = load_params(PairParams)
    cfg = load_params(TokenizeParams)
    require_file(split_dir, "split")
    # Imported only now: datasets takes a second to import, and a missing input should answer
    # at once.
    from datasets import DatasetDict, disable_progress_bars, load_from_disk

    disable_progress_bars()
    parent = parent_record(parent_dir)
    num_proc = cfg.num_proc or usable_cpus()
    params = {"pair": pair.model_dump(), "tokenize": cfg.model_dump()}
    with tracking.stage_run("tokenize", params, deps=[split_dir]) as run:
        # the text as split; the parent run lists the token ids the model saw instead
        run.log_datasets(split_dir, dict.fromkeys(("train", "valid", "test"), "tokenization"),
                         on_parent=False)
        if parent:
            reuse_tokenizer(parent_dir, tokenizer_dir)
            print(f"tokenize: the tokenizer of {parent['init_from']} (tokenize.* other than "
                  f"num_proc do not apply)")
        else:
            write_tokenizers(split_dir, pair, cfg, tokenizer_dir)
        splits = load_from_disk(str(split_dir))
        tok = load_tokenizers(tokenizer_dir)
        stats: dict[str, float] = {
            "source_vocab": tok.source_vocab,
            "target_vocab": tok.target_vocab,
        }
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".tokenize-", dir=out_dir.parent) as work:
            encoded = {name: encode_split(part, name, tokenizer_dir, Path(work), num_proc)
                       for name, part in splits.items()}
            for name, part in encoded.items():
                stats[f"{name}_unk_rate"] = round(unk_rate(part), 6)
            stats.update(length_stats(column_lengths(encoded["train"], "source_ids"), "source"))
            stats.update(length_stats(column_lengths(encoded["train"], "target_ids"), "target"))
            disable_progress_bars()
            with atomic_dir(out_dir) as tmp:
                DatasetDict(encoded).save_to_disk(str(tmp))
                (tmp / ENCODED_WITH).write_text(tokenizer_digest(tokenizer_dir) + "\n")
        write_json(stats_path, stats)
        run.log_metrics(stats)
        run.log_artifacts(tokenizer_dir, "tokenizer")
    print("tokenize: " + ", ".join(f"{k} {v}" for k, v in stats.items()))


if __name__ == "__main__":
    run_cli(app)
