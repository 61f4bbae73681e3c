"""evaluate: models/model.pt + test split -> data/eval/metrics.json and translations.tsv.

Reads params `pair.target_lang` (sacreBLEU tokenizer: `zh` for Chinese, `char` for
Japanese/Korean, `13a` otherwise) and `evaluate.*`. Translates the test split
with batched beam search, scores corpus BLEU and chrF with sacreBLEU, writes a metrics JSON
(a DVC metric) and a TSV of source / reference / hypothesis, and logs samples to MLflow.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import torch
import typer
from rich.progress import Progress

from src import checkpoint, paths, tracking
from src.atomic import atomic_path, write_json
from src.batching import clip_source, pad
from src.errors import require_file, run_cli
from src.params import EvaluateParams, PairParams, load_params
from src.search import beam_search, max_output_length
from src.vocab import load_tokenizers

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def bleu_tokenizer(target_lang: str) -> str:
    """sacreBLEU's tokenizer for a target language (character-level for CJK)."""
    lang = target_lang.lower().split("-")[0]
    if lang in {"zh", "cmn"}:
        return "zh"
    if lang in {"ja", "ko"}:
        return "char"
    return "13a"


def score(hypotheses: list[str], references: list[str], target_lang: str) -> dict[str, float]:
    import sacrebleu

    bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize=bleu_tokenizer(target_lang))
    chrf = sacrebleu.corpus_chrf(hypotheses, [references])
    return {
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf.score, 2),
        "bleu_brevity_penalty": round(bleu.bp, 4),
    }


def translate_ids(
    model, sources: list[list[int]], cfg: EvaluateParams, progress: Progress | None = None
) -> list[list[int]]:
    """Beam-search every source (id lists), batched by length; output order = input order."""
    # Length-sorted batches pad little; results are written back in input order.
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    out: list[list[int]] = [[] for _ in sources]
    task = progress.add_task("translate", total=len(sources)) if progress else None
    for idx in batches:
        src = pad([clip_source(sources[i], model.max_positions) for i in idx])
        max_len = max_output_length(src, cfg.max_length_ratio, model)
        hyps = beam_search(model, src, cfg.beam_size, max_len, cfg.length_penalty)
        for i, hyp in zip(idx, hyps):
            out[i] = hyp
        if progress:
            progress.advance(task, len(idx))
    return out


@app.command()
def main(
    model_path: Path = typer.Option(paths.MODELS / "model.pt", help="Model from `train`."),
    split_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded splits."),
    tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir."),
    split: str = typer.Option("test", help="Which split to translate."),
    metrics: Path = typer.Option(paths.EVAL_METRICS, help="Metrics JSON to write."),
    translations: Path = typer.Option(paths.EVAL_TRANSLATIONS, help="TSV to write."),
) -> None:
    """Translate the test split with beam search (params `evaluate.*`) and score BLEU/chrF."""
    from datasets import load_from_disk

    pair, cfg = load_params("pair", "evaluate")
    pair: PairParams
    cfg: EvaluateParams
    for path, stage in (
        (model_path, "train"),
        (split_dir, "tokenize"),
        (tokenizer_dir, "tokenize"),
    ):
        require_file(path, stage)
    torch.set_num_threads(os.cpu_count() or 1)
    model, _ = checkpoint.load_model(model_path)
    tok = load_tokenizers(tokenizer_dir)
    part = load_from_disk(str(split_dir))[split]
    sources, references = list(part["source"]), list(part["target"])
    params = {"pair": pair.model_dump(), "evaluate": cfg.model_dump()}
    with tracking.stage_run("evaluate", params, deps=[model_path, split_dir]) as run:
        start = time.perf_counter()
        with Progress(transient=True) as progress:
            hyp_ids = translate_ids(model, list(part["source_ids"]), cfg, progress)
        seconds = time.perf_counter() - start
        hypotheses = tok.decode_target(hyp_ids)
        result = score(hypotheses, references, pair.target_lang)
        result.update(
            {
                "bleu_tokenizer": bleu_tokenizer(pair.target_lang),
                "split": split,
                "sentences": len(sources),
                "beam_size": cfg.beam_size,
                "sentences_per_s": round(len(sources) / max(seconds, 1e-9), 2),
            }
        )
        with atomic_path(translations) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(["source", "reference", "hypothesis"])
            writer.writerows(zip(sources, references, hypotheses))
        write_json(metrics, result)
        run.log_metrics({k: v for k, v in result.items() if isinstance(v, (int, float))})
        n = cfg.num_samples
        run.log_table(
            {"source": sources[:n], "reference": references[:n], "hypothesis": hypotheses[:n]},
            "samples.json",
        )
        run.log_artifact(translations, "evaluate")
    print(
        f"evaluate: BLEU {result['bleu']} chrF {result['chrf']} on {len(sources):,} "
        f"{split} sentences (beam {cfg.beam_size}, {result['sentences_per_s']} sent/s)"
    )


if __name__ == "__main__":
    run_cli(app)
