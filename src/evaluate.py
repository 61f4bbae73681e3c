"""evaluate: models/model.pt + test split(s) -> data/eval/{metrics,stats}.json, translations.tsv.

Reads params `evaluate.*`; the target language, which picks sacreBLEU's tokenizer (`zh` for
Chinese, `char` for Japanese/Korean, `13a` otherwise), comes from the tokenizer's
tokenizer.json. Translates the test split, and each named test set (`download.test_sets`, the
`test_<name>` splits), with batched beam search and scores each on its own: corpus BLEU and chrF
with sacreBLEU, overall and by length (<= 6, 7-9, >= 10 words of the English side: the source,
or the reference for X -> English), with sacreBLEU's signatures, and how well the search's own
score ranks the bad translations (sentence chrF below `confidence.CHRF_THRESHOLD`): the AUROC of
the confidence feature (src/runtime/confidence.py), the share of the worst 10% caught by
reviewing the least confident 10%, and a risk-coverage curve (data/eval/risk_coverage.csv, a
DVC plot). The scores are the DVC metrics
(data/eval/metrics.json: the test split's at the top, each named set under `test_sets`);
stats.json adds counts and settings; a TSV holds source / reference / hypothesis / set; MLflow
gets all of it (a named set's metrics prefixed with its name) and sample translations. No test
set ever picks a checkpoint: train selects on the valid split only.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import typer
from rich.progress import Progress

from src.core import paths, tracking
from src.core.atomic import atomic_path, write_json
from src.core.cli import run_cli
from src.core.cpus import usable_cpus
from src.core.errors import require_file
from src.core.metrics import bleu_tokenizer, score, score_by_length, sentence_chrf
from src.core.params import EvaluateParams, load_params
from src.core.reports import (
    EVALUATE_HEADLINE,
    LENGTH_BUCKETS,
    headline,
    write_curve,
    write_report,
)
from src.data.subword import check_encoded_with, load_tokenizers
from src.runtime import confidence

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
NAMED_PREFIX = paths.NAMED_TEST_SPLIT.format("")  # the splits of the named test sets


def length_side(sources: list[str], references: list[str], source_lang: str,
                target_lang: str) -> list[str]:
    """The texts whose words place each pair in a length bucket: the English side when there is
    one, so both directions of a corpus bucket the same pairs (a Chinese source, written without
    spaces, would count as one word); otherwise the source."""
    return references if target_lang == "en" and source_lang != "en" else sources


@app.command()
def main(
    model_path: Path = typer.Option(paths.MODELS / "model.pt", help="Model from `train`."),
    split_dir: Path = typer.Option(paths.TOKENIZED, help="Encoded splits."),
    tokenizer_dir: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir."),
    split: str = typer.Option("test", help="Which split to translate."),
    metrics: Path = typer.Option(paths.EVAL_METRICS, help="Scores JSON to write (DVC metrics)."),
    stats: Path = typer.Option(paths.EVAL_STATS, help="Scores, counts and settings JSON."),
    translations: Path = typer.Option(paths.EVAL_TRANSLATIONS, help="TSV to write."),
    risk_coverage: Path = typer.Option(paths.EVAL_RISK_COVERAGE,
                                       help="Risk-coverage curve of the test split (CSV)."),
) -> None:
    """Translate the test split and each named test set with beam search (params
    `evaluate.*`) and score each: BLEU and chrF, overall and by source length."""
    cfg = load_params(EvaluateParams)
    for path, stage in (
        (model_path, "train"),
        (split_dir, "tokenize"),
        (tokenizer_dir, "tokenize"),
    ):
        require_file(path, stage)
    # Imported only now: torch takes seconds to import, and `--help` or a missing input should
    # answer at once.
    import torch
    from datasets import load_from_disk

    from src.nmt import checkpoint

    torch.set_num_threads(usable_cpus())
    model, _ = checkpoint.load_model(model_path)
    check_encoded_with(split_dir, tokenizer_dir)
    tok = load_tokenizers(tokenizer_dir)
    splits = load_from_disk(str(split_dir))
    named = sorted(name for name in splits if name.startswith(NAMED_PREFIX))
    params = {"evaluate": cfg.model_dump()}
    with tracking.stage_run("evaluate", params, deps=[model_path, split_dir]) as run:
        run.log_datasets(split_dir, dict.fromkeys([split, *named], "evaluation"))
        outputs = {name: translate_and_score(model, splits[name], tok, cfg)
                   for name in (split, *named)}
        result = outputs[split][0] | {"split": split}
        write_curve(risk_coverage, result.pop("risk_coverage"))
        for one, *_ in list(outputs.values())[1:]:
            one.pop("risk_coverage")
        if named:
            result["test_sets"] = {name.removeprefix(NAMED_PREFIX): outputs[name][0]
                                   for name in named}
        with atomic_path(translations) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(["source", "reference", "hypothesis", "set"])
            for name, (_, sources, references, hypotheses) in outputs.items():
                label = name.removeprefix(NAMED_PREFIX) if name != split else split
                writer.writerows((*row, label) for row in zip(sources, references, hypotheses))
        write_report(result, stats, metrics, EVALUATE_HEADLINE)
        if named:  # the headline of each named set beside the test split's
            report = json.loads(metrics.read_text(encoding="utf-8"))
            report["test_sets"] = {name: headline(one, EVALUATE_HEADLINE)
                                   for name, one in result["test_sets"].items()}
            write_json(metrics, report)
        run.log_metrics({k: v for k, v in result.items() if isinstance(v, (int, float))}
                        | {f"{name}_{k}": v for name, one in result.get("test_sets", {}).items()
                           for k, v in one.items() if isinstance(v, (int, float))})
        n = cfg.num_samples
        _, sources, references, hypotheses = outputs[split]
        run.log_table(
            {"source": sources[:n], "reference": references[:n], "hypothesis": hypotheses[:n]},
            "samples.json",
        )
        run.log_artifact(translations, "evaluate")
        run.log_artifact(risk_coverage, "evaluate")
    for name, (one, sources, _, _) in outputs.items():
        by_length = ", ".join(f"{bucket} {one[f'bleu_{bucket}']}"
                              for bucket, _, _ in LENGTH_BUCKETS if f"bleu_{bucket}" in one)
        label = (f"test set {name.removeprefix(NAMED_PREFIX)}" if name != split
                 else f"{split} sentences")
        print(
            f"evaluate: BLEU {one['bleu']} chrF {one['chrf']} on {len(sources):,} "
            f"{label} (beam {cfg.beam_size}, {one['sentences_per_s']} sent/s); "
            f"BLEU by source length: {by_length}"
        )


def translate_and_score(model, part, tok, cfg: EvaluateParams):
    """Beam-search translations of one split and their scores (overall, by length, with
    sacreBLEU's signatures); returns (scores, sources, references, hypotheses)."""
    from src.nmt.search import translate_ids  # torch: see main

    sources, references = list(part["source"]), list(part["target"])
    target_lang = tok.target_lang
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        found = translate_ids(
            model, list(part["source_ids"]), cfg.beam_size, cfg.length_penalty,
            cfg.max_length_ratio, cfg.batch_size, progress, with_scores=True,
        )
    seconds = time.perf_counter() - start
    hyp_ids = [ids for ids, _ in found]
    hypotheses = tok.decode_target(hyp_ids)
    result = score(hypotheses, references, target_lang, signatures=True)
    features = [confidence.mean_logp(s, len(ids) + 1, cfg.length_penalty) for ids, s in found]
    result |= confidence_report(features, sentence_chrf(hypotheses, references))
    by_words = length_side(sources, references, tok.source_lang, target_lang)
    result |= score_by_length(by_words, hypotheses, references, target_lang, LENGTH_BUCKETS)
    result.update(
        {
            "bleu_tokenizer": bleu_tokenizer(target_lang),
            "sentences": len(sources),
            "beam_size": cfg.beam_size,
            "sentences_per_s": round(len(sources) / max(seconds, 1e-9), 2),
        }
    )
    return result, sources, references, hypotheses


def confidence_report(features: list[float], chrf: list[float]) -> dict:
    """How well the confidence feature ranks the bad translations (sentence chrF below
    `confidence.CHRF_THRESHOLD`): its AUROC, the share of the worst 10% the least confident
    10% holds, and the risk-coverage rows (popped by the caller for the plot)."""
    bad = [c < confidence.CHRF_THRESHOLD for c in chrf]
    report = {"bad_share": round(sum(bad) / max(len(bad), 1), 4),
              "bad_below_chrf": confidence.CHRF_THRESHOLD,
              "review_catch_10": round(confidence.review_catch(features, chrf), 4),
              "risk_coverage": confidence.risk_coverage(features, chrf)}
    auroc = confidence.auroc([-f for f in features], bad)
    if auroc is not None:  # both good and bad translations are there
        report["confidence_auroc"] = round(auroc, 4)
    return report


if __name__ == "__main__":
    run_cli(app)
