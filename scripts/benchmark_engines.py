"""Same weights, two engines: our exported ONNX models against CTranslate2 on real sentences.

Converts models/model.pt to CTranslate2 (src.to_ctranslate2), checks that both engines
translate the test split alike (identical strings and BLEU, beam 4, batch 32, fp32 and int8),
then times text -> text (SentencePiece included on both sides) on the test sources at their
natural lengths, sorted by source tokens into batches as `src.infer --input` does, for every
beam x batch x precision x thread count asked for. Needs the optional extra:

    pip install -e '.[ctranslate2]'
    python scripts/benchmark_engines.py                                  # everything
    python scripts/benchmark_engines.py --sentences 300 --threads 1 --json out.json

Not a test: timings need an otherwise idle machine. Both engines get the same batches in the
same order; each configuration runs engine after engine, `--repeats` times, and each engine's
fastest pass counts, so drift and noise hit both alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from src.core import paths  # noqa: E402
from src.core.scoring import bleu  # noqa: E402
from src.data.subword import drop_broken_bytes  # noqa: E402
from src.runtime import generation
from src.to_ctranslate2 import convert, ct2_options, pieces  # noqa: E402


class Ct2Engine:
    """CTranslate2 behind the same translate(lines, beam, batch) interface as ours."""

    def __init__(self, model_dir: Path, tokenizer_dir: Path, compute_type: str, threads: int,
                 meta: dict[str, str], device: str = "cpu"):
        import ctranslate2
        import sentencepiece as spm

        self.translator = ctranslate2.Translator(str(model_dir), device=device,
                                                 compute_type=compute_type,
                                                 intra_threads=threads, inter_threads=1)
        self.source, self.target = (
            spm.SentencePieceProcessor(model_file=str(tokenizer_dir / f"{side}.model"))
            for side in ("source", "target"))
        self.target_pieces = pieces(self.target)
        self.eos_piece = self.source.id_to_piece(int(meta["eos_id"]))
        self.meta = meta

    def run(self, lines: list[str], beam: int) -> list[str]:
        tokens = [self.source.encode(line, out_type=str)[: self.limit() - 1] + [self.eos_piece]
                  for line in lines]
        new_tokens = generation.max_new_tokens(
            max(len(t) for t in tokens), float(self.meta["max_length_ratio"]),
            int(self.meta["max_output_tokens"]))
        results = self.translator.translate_batch(
            tokens, **ct2_options(self.target_pieces, beam, new_tokens,
                                  float(self.meta["length_penalty"])))
        # As our decoders do: drop stray byte pieces, so both engines are scored alike.
        return [drop_broken_bytes(self.target.decode(r.hypotheses[0])) for r in results]

    def limit(self) -> int:
        return int(self.meta["max_source_tokens"])


class OnnxEngine:
    def __init__(self, path: Path, threads: int, device: str = "cpu"):
        self.translator = generation.load_translator(path, provider=device, threads=threads,
                                                     warn=lambda _: None)

    def run(self, lines: list[str], beam: int) -> list[str]:
        return self.translator.translate(lines, beam, None, batch_size=len(lines))


def translate_all(engine, lines: list[str], batch_size: int, beam: int,
                  lengths: dict[int, int]):
    """The file through `engine` in src.infer's batches (by source tokens, `lengths`);
    (translations, seconds)."""
    start = time.perf_counter()
    out = generation.translate_in_batches(
        lines, batch_size, lambda idx: engine.run([lines[i] for i in idx], beam), lengths)
    return out, time.perf_counter() - start


def load_test(split_dir: Path) -> tuple[list[str], list[str]]:
    from datasets import load_from_disk

    test = load_from_disk(str(split_dir))["test"]
    return list(test["source"]), list(test["target"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=paths.MODELS,
                        help="dir with model.pt, model.onnx, model.int8.onnx, tokenizer/")
    parser.add_argument("--split-dir", type=Path, default=paths.TOKENIZED)
    parser.add_argument("--sentences", type=int, default=0,
                        help="time the first N test sentences (0: all)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--precisions", default="fp32,int8",
                        help="of fp32, int8, fp16 (fp16: --device cuda only)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: our files on ONNX Runtime's CUDA provider (onnxruntime-gpu) "
                             "and CTranslate2 on the GPU; threads then only feed the CPU side")
    parser.add_argument("--repeats", type=int, default=3,
                        help="time each configuration this often, engines alternating; the "
                             "fastest pass counts (this machine's run-to-run noise is ~20%%)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    if args.device == "cuda":
        require_gpu()
    tokenizer_dir = args.models / "tokenizer"
    onnx_files = {"fp32": args.models / "model.onnx", "int8": args.models / "model.int8.onnx",
                  "fp16": args.models / "model.fp16.onnx"}  # fp16: CUDA only
    ct2_types = {"fp32": "float32", "int8": "int8", "fp16": "float16"}
    sources, references = load_test(args.split_dir)
    target_lang = json.loads((tokenizer_dir / "tokenizer.json").read_text())["target_lang"]
    reference = generation.load_translator(onnx_files["fp32"], threads=1, warn=lambda _: None)
    meta = reference.meta
    lengths = {i: len(reference.encode(line, i + 1))  # source tokens, as src.infer batches
               for i, line in enumerate(sources) if line.strip()}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        ct2_dir = convert(args.models / "model.pt", tokenizer_dir, Path(work) / "ct2")
        engines = {
            ("ours", p): lambda p=p, t=2: OnnxEngine(onnx_files[p], t, args.device)
            for p in args.precisions.split(",")}
        engines |= {("ctranslate2", p): lambda p=p, t=2: Ct2Engine(ct2_dir, tokenizer_dir,
                                                                     ct2_types[p], t, meta,
                                                                     args.device)
                    for p in args.precisions.split(",")}

        # 1. Same translations? Whole test split, beam 4, batch 32, 2 threads.
        quality, outputs = {}, {}
        for (engine_name, precision), make in engines.items():
            outputs[engine_name, precision], _ = translate_all(make(), sources, 32, 4,
                                                         lengths)
            quality[engine_name, precision] = bleu(outputs[engine_name, precision],
                                                   references, target_lang)
        for precision in args.precisions.split(","):
            ours, theirs = outputs["ours", precision], outputs["ctranslate2", precision]
            same = sum(a == b for a, b in zip(ours, theirs)) / len(ours)
            row = {"kind": "quality", "precision": precision, "beam": 4, "batch": 32,
                   "sentences": len(sources), "bleu_ours": quality["ours", precision],
                   "bleu_ctranslate2": quality["ctranslate2", precision],
                   "identical": round(same, 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)

        # 2. Speed at natural lengths.
        lines = sources[: args.sentences] if args.sentences else sources
        for threads in ints(args.threads):
            for precision in args.precisions.split(","):
                loaded = {name: make(t=threads) for (name, p), make in engines.items()
                          if p == precision}
                for beam in ints(args.beams):
                    for size in ints(args.batches):
                        row = {"kind": "speed", "precision": precision, "threads": threads,
                               "beam": beam, "batch": size, "sentences": len(lines),
                               "repeats": args.repeats}
                        best = {name: float("inf") for name in loaded}
                        for engine in loaded.values():
                            engine.run(lines[:size], beam)  # warm-up
                        for _ in range(args.repeats):
                            for name, engine in loaded.items():
                                _, seconds = translate_all(engine, lines, size, beam, lengths)
                                best[name] = min(best[name], seconds)
                        for name, seconds in best.items():
                            row[f"{name}_sent_per_s"] = round(len(lines) / seconds, 1)
                        row["ours_vs_ctranslate2"] = round(
                            row["ours_sent_per_s"] / row["ctranslate2_sent_per_s"], 2)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    print_table(rows)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        args.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv),
                                         "commit": commit, "rows": rows}, indent=1) + "\n")


def require_gpu() -> None:
    """Both engines must see a GPU, or the comparison would quietly time a CPU."""
    import ctranslate2
    import onnxruntime as ort

    if ctranslate2.get_cuda_device_count() == 0 \
            or generation.CUDA not in ort.get_available_providers():
        sys.exit("error: --device cuda needs a GPU that CTranslate2 sees and onnxruntime-gpu's "
                 "CUDA provider; this machine has "
                 f"{ctranslate2.get_cuda_device_count()} CUDA device(s) for CTranslate2 and "
                 f"providers {', '.join(ort.get_available_providers())}")


def print_table(rows: list[dict]) -> None:
    print("\n| precision | beam | batch | threads | ours sent/s | CTranslate2 sent/s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["kind"] == "speed":
            print(f"| {r['precision']} | {r['beam']} | {r['batch']} | {r['threads']} | "
                  f"{r['ours_sent_per_s']} | {r['ctranslate2_sent_per_s']} | "
                  f"{r['ours_vs_ctranslate2']} |")


if __name__ == "__main__":
    main()
