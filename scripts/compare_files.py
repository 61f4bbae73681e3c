"""A/B speed of two or more exports of our model: the same test sentences through each directory's
model.onnx / model.int8.onnx, files alternating, the fastest of `--repeats` passes counting.

    python scripts/compare_files.py old_models/ models/ --threads 1 --precisions int8,fp32

Prints sentences/s per file for every precision x beam x batch, and the share of translations
identical to the first directory's. Not a test: timings need an otherwise idle machine; this
one drifts by tens of percent within an hour, so only files compared in one run compare.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from src.core import paths  # noqa: E402
from src.runtime import generation  # noqa: E402

FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path,
                        help="directories with model.onnx, model.int8.onnx and tokenizer/")
    parser.add_argument("--split-dir", type=Path, default=paths.TOKENIZED)
    parser.add_argument("--sentences", type=int, default=500, help="the first N test sources")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--precisions", default="int8,fp32")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from datasets import load_from_disk

    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    lines = list(load_from_disk(str(args.split_dir))["test"]["source"])[: args.sentences]
    for threads in ints(args.threads):
        for precision in args.precisions.split(","):
            translators = [generation.load_translator(d / FILES[precision], threads=threads)
                           for d in args.dirs]
            for beam in ints(args.beams):
                for size in ints(args.batches):
                    best = [float("inf")] * len(translators)
                    outputs: list[list[str]] = [[] for _ in translators]
                    for translator in translators:  # warm-up
                        translator.translate(lines[:size], beam, batch_size=size)
                    for _ in range(args.repeats):
                        for i, translator in enumerate(translators):
                            start = time.perf_counter()
                            outputs[i] = translator.translate(lines, beam, batch_size=size)
                            best[i] = min(best[i], time.perf_counter() - start)
                    speeds = "  ".join(f"{d}: {len(lines) / s:.1f}"
                                       for d, s in zip(args.dirs, best))
                    same = [sum(a == b for a, b in zip(outputs[0], o)) / len(lines)
                            for o in outputs[1:]]
                    print(f"{precision} threads {threads} beam {beam} batch {size}: {speeds} "
                          f"sent/s; identical to the first: "
                          f"{', '.join(f'{x:.1%}' for x in same)}", flush=True)


if __name__ == "__main__":
    main()
