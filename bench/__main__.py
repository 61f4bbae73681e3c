"""`python -m bench`: every tool, what it measures, and the doc page and file it feeds."""

from __future__ import annotations

# module -> (what it measures or does, the page that shows it, the file it writes or reads)
TOOLS = {
    "train_speed_vs_peer": ("training tokens/s of the train stage beside the Hugging Face peer,"
                            " fp32 and bf16, and the matmul peaks",
                            "docs/results.md", "docs/benchmarks/train_speed_sittings.json"),
    "train_step_speed": ("tokens/s of one Trainer.step, its levers off or on, its profile",
                         "docs/training_speed.md",
                         "docs/benchmarks/train_levers_epyc_zen5.json"),
    "translation_speed": ("sent/s of PyTorch without and with cache, model.onnx and int8, ids "
                          "in and out", "docs/results.md", "docs/benchmarks/infer_speed.json"),
    "engines_vs_ctranslate2": ("our ONNX files against CTranslate2, text to text: same "
                               "translations, sent/s, the cost of scores", "docs/engines.md",
                               "docs/benchmarks/engines_*.json, score_cost_both.json"),
    "engine_tables": ("the tables of engines_vs_ctranslate2 sittings (prints, merges)",
                      "docs/engines.md", "docs/benchmarks/engines_*.json"),
    "files_speed_ab": ("speed A/B of two or more exports of the model, paired pass by pass",
                       "docs/engines.md", "(prints)"),
    "file_profile": ("ONNX Runtime's profile of one exported file, by operator or node",
                     "docs/engines.md", "docs/benchmarks/profile_beam4_batch1_epyc.txt"),
    "ort_kernels": ("ONNX Runtime kernels at our decoder's shapes (int8, log-probs, threads, "
                    "the BeamSearch operator)", "docs/engines.md, docs/serving.md",
                    "docs/benchmarks/kernels*.json"),
    "serving_load": ("latency and sent/s of a served model under concurrent clients",
                     "docs/serving.md", "(--json; gpu_check's serve rows)"),
    "serving_threads": ("the served model per ONNX Runtime thread count, in rounds; its table",
                        "docs/serving.md", "docs/benchmarks/serving_xeon_amx.json"),
    "web_page_speed": ("the web page's weight, cold load and sent/s in Chromium beside native",
                       "docs/web.md", "docs/benchmarks/web_page.json"),
    "gpu_check": ("what a GPU adds: placement, parity, BLEU, batch table, serving, engines, "
                  "training", "docs/gpu.md", "docs/benchmarks/gpu_check.json"),
    "data_scaling": ("seconds and peak memory of the data stages as the corpus grows (--corpus:"
                     " only write a recombined corpus to try them on)", "docs/scaling.md",
                     "docs/benchmarks/data_scaling_sittings.json"),
    "paired_significance": ("is a candidate's BLEU better than a baseline's: paired bootstrap "
                            "or approximate randomisation", "docs/experiments.md", "(prints)"),
    "decoding_choices": ("beam size, length penalty and checkpoint on one model, valid and "
                         "test, paired tests", "docs/results.md",
                         "docs/benchmarks/decoding.json"),
    "experiments": ("the experiment rows as DVC experiments (test BLEU, chrF, valid loss)",
                    "docs/results.md, docs/experiments.md", "docs/experiments.jsonl"),
    "old_new_halves": ("BLEU and chrF of models on the old and the new half of the training "
                       "pairs", "docs/experiments.md",
                       "docs/benchmarks/continuous_training.json"),
    "finetune_pilot": ("fine-tune recipes side by side from one parent, valid split only",
                       "docs/experiments.md", "docs/benchmarks/finetune_pilot_gpu.json"),
    "mutation_score": ("the share of mutants the tests kill, per module (mutmut)",
                       "docs/testing.md", "docs/benchmarks/mutation.json"),
    "results_page": ("writes docs/results.md from the raw rows (--check: is it current)",
                     "docs/results.md", "docs/experiments.jsonl, docs/benchmarks/*.json"),
}


def listing() -> str:
    width = max(map(len, TOOLS))
    lines = ["python -m bench.<tool> --help for its options; each feeds a page and a file:", ""]
    for name, (what, page, data) in TOOLS.items():
        lines += [f"{name:<{width}}  {what}", f"{'':<{width}}  -> {page}; {data}"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(listing())
