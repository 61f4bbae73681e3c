"""A/B speed of two or more exports of our model: the same test sentences through each directory's
model.onnx / model.int8.onnx, files alternating pass by pass in one process, the order reversed
every round.

    python scripts/compare_files.py old_models/ models/ --threads 1 --precisions int8,fp32
    python scripts/compare_files.py models/ --scores --beams 1 --batches 32 --repeats 20
    python scripts/compare_files.py models/ models/ --whole-first --batches 32 --repeats 16
    python scripts/compare_files.py old_twins/ models/ --text --batches 1,32

Prints sentences/s per file (its fastest pass) for every precision x beam x batch, each file's
speed against the first's as the median of the rounds' ratios (a round's two passes run seconds
apart, so the machine's drift hits both), and the share of translations identical to the first
directory's. `--scores`: each file is also timed returning scores (`translate_scored`), as
`<dir>+scores`. `--whole-first`: the first directory's batches go through the file as written,
BeamSearch operator included, as before the runtime cut it out for batches
(src/runtime/batch_graph.py), labelled `<dir>(whole)`. Not a test: timings need an otherwise
idle machine. `--text`: the text twins (model.text.onnx, model.int8.text.onnx) instead, each
searching as written (`--beams` does not apply).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from src.core import paths  # noqa: E402
from src.runtime import generation  # noqa: E402

FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
TEXT_FILES = {"fp32": "model.text.onnx", "int8": "model.int8.text.onnx"}


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
    parser.add_argument("--scores", action="store_true",
                        help="also time each file returning scores")
    parser.add_argument("--whole-first", action="store_true",
                        help="the first directory's batches through the file as written "
                             "(no cut of its BeamSearch operator)")
    parser.add_argument("--text", action="store_true",
                        help="time the text twins, each with the search it was written with")
    args = parser.parse_args()
    from datasets import load_from_disk

    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    lines = list(load_from_disk(str(args.split_dir))["test"]["source"])[: args.sentences]
    modes = (False, True) if args.scores else (False,)
    labels = [f"{d}{'(whole)' if i == 0 and args.whole_first else ''}"
              for i, d in enumerate(args.dirs)]
    names = [f"{label}{'+scores' if scored else ''}" for label in labels for scored in modes]
    files = TEXT_FILES if args.text else FILES
    beams = [None] if args.text else ints(args.beams)  # None: the file's own beam
    for threads in ints(args.threads):
        for precision in args.precisions.split(","):
            translators = [generation.load_translator(d / files[precision], threads=threads)
                           for d in args.dirs]
            if args.whole_first:
                translators[0].open_batch = None
            for beam in beams:
                for size in ints(args.batches):
                    runs = [passes(t, lines, beam, size, scored)
                            for t in translators for scored in modes]
                    for run in runs:  # warm-up
                        run(lines[:size])
                    seconds: list[list[float]] = [[] for _ in runs]
                    outputs: list[list[str]] = [[] for _ in runs]
                    for round_no in range(args.repeats):
                        order = list(range(len(runs)))
                        for i in order if round_no % 2 == 0 else order[::-1]:
                            start = time.perf_counter()
                            outputs[i] = runs[i](lines)
                            seconds[i].append(time.perf_counter() - start)
                    speeds = "  ".join(f"{name}: {len(lines) / min(s):.1f}"
                                       for name, s in zip(names, seconds))
                    paired = [statistics.median(a / b for a, b in zip(seconds[0], s))
                              for s in seconds[1:]]
                    same = [sum(a == b for a, b in zip(outputs[0], o)) / len(lines)
                            for o in outputs[1:]]
                    print(f"{precision} threads {threads} beam {beam or 'as written'} batch "
                          f"{size}: {speeds} "
                          f"sent/s; speed against the first (median of {args.repeats} rounds): "
                          f"{', '.join(f'{x:.3f}' for x in paired)}; identical to the first: "
                          f"{', '.join(f'{x:.1%}' for x in same)}", flush=True)


def passes(translator, lines: list[str], beam: int, size: int, scored: bool):
    """One pass over `lines` -> the translations (with scores asked for: the best one's)."""
    if scored:
        return lambda batch: [hyps[0].text if hyps else "" for hyps in
                              translator.translate_scored(batch, beam, batch_size=size)]
    return lambda batch: translator.translate(batch, beam, batch_size=size)


if __name__ == "__main__":
    main()
