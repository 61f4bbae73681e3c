"""Does torch in the process slow CTranslate2? One plain translate_batch loop, one sentence a call.

    python scripts/ct2_torch_import.py CT2_DIR --tokenizer models/tokenizer --input test.en \
        --threads 2 --compute-type int8 [--torch-first]

Run it in a fresh process per setting, alternating with and without `--torch-first`, on an idle
machine (docs/engines.md, "Torch in the process"). Prints one line of sent/s (best pass).
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="CTranslate2 model dir (python -m src.to_ctranslate2)")
    parser.add_argument("--tokenizer", required=True, help="dir with source.model")
    parser.add_argument("--input", required=True, help="source sentences, one per line")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--torch-first", action="store_true",
                        help="import torch before ctranslate2, as the old harness did")
    args = parser.parse_args()
    if args.torch_first:
        import torch  # noqa: F401
    import ctranslate2
    import sentencepiece as spm

    source = spm.SentencePieceProcessor(model_file=f"{args.tokenizer}/source.model")
    with open(args.input, encoding="utf-8") as fh:
        lines = fh.read().splitlines()[: args.sentences]
    tokens = [source.encode(line, out_type=str) + ["</s>"] for line in lines]
    translator = ctranslate2.Translator(args.model, device="cpu",
                                        compute_type=args.compute_type,
                                        intra_threads=args.threads, inter_threads=1)
    translator.translate_batch(tokens[:5], beam_size=1, max_decoding_length=args.max_length)
    best = float("inf")
    for _ in range(args.passes):
        start = time.perf_counter()
        for sentence in tokens:
            translator.translate_batch([sentence], beam_size=1,
                                       max_decoding_length=args.max_length)
        best = min(best, time.perf_counter() - start)
    first = "torch first" if args.torch_first else "ctranslate2 only"
    print(f"{first}, {args.threads} threads, {args.compute_type}: "
          f"{len(tokens) / best:.1f} sent/s ({'torch' in sys.modules=})")


if __name__ == "__main__":
    main()
