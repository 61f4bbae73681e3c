"""Same weights, two engines: our exported ONNX models against CTranslate2, text to text (same
translations, sent/s, the cost of scores), each engine timed in a process of its own without
torch. Needs `pip install -e '.[ctranslate2]'`; options and method: docs/engines.md; its
sittings: docs/benchmarks/engines_*.json, score_cost_both.json.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import typer

from bench import common, engine_tables
from bench.common import ints
from src.core import paths
from src.core.metrics import bleu
from src.data.subword import decode_ids, drop_broken_bytes, load_tokenizers
from src.runtime import contract, generation, placement  # no onnxruntime until a session opens
from src.runtime.length_batches import translate_in_batches

# What no timing process may hold: torch, and the other engine's runtime.
FOREIGN = {"ours": ("torch", "ctranslate2"), "ours_baseline": ("torch", "ctranslate2"),
           "ctranslate2": ("torch", "onnxruntime")}


class Engine:
    """From the worker's spec: `n_best` hypotheses, `scores` returned, `force_length` tokens."""

    def __init__(self, spec: dict):
        self.n_best, self.scores = spec.get("n_best", 1), spec.get("scores", False)
        self.force_length = spec.get("force_length")


class Ct2Engine(Engine):
    """CTranslate2 behind the same run(lines, beam) interface as ours."""

    COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "fp16": "float16"}

    def __init__(self, spec: dict):
        import ctranslate2

        from src.to_ctranslate2 import ct2_options, pieces

        super().__init__(spec)
        self.options = ct2_options  # imported here, not on each timed call
        self.translator = ctranslate2.Translator(
            spec["ct2_dir"], device=spec["device"],
            compute_type=self.COMPUTE_TYPES[spec["precision"]],
            intra_threads=spec["threads"], inter_threads=1)
        tokenizers, self.meta = load_tokenizers(spec["tokenizer_dir"]), spec["meta"]
        self.source, self.target = tokenizers.source, tokenizers.target
        self.target_pieces = pieces(self.target)
        self.eos_piece = self.source.id_to_piece(int(self.meta["eos_id"]))

    def run(self, lines: list[str], beam: int) -> list[str]:
        limit = int(self.meta["max_source_tokens"]) - 1  # the EOS is the last source token
        tokens = [self.source.encode(line, out_type=str)[:limit] + [self.eos_piece]
                  for line in lines]
        new_tokens = self.force_length or contract.max_new_tokens(
            max(len(t) for t in tokens), float(self.meta["max_length_ratio"]),
            int(self.meta["max_output_tokens"]))
        extra = {}
        if self.scores or self.n_best > 1:
            extra = {"return_scores": True, "num_hypotheses": self.n_best}
        if self.force_length:
            extra["min_decoding_length"] = self.force_length
        options = self.options(self.target_pieces, beam, new_tokens,
                               float(self.meta["length_penalty"]))
        results = self.translator.translate_batch(tokens, **(options | extra))
        if self.force_length:
            check_lengths([len(r.hypotheses[0]) for r in results], self.force_length)
        # As our decoders do: every hypothesis of an n-best list to text (ours returns each),
        # stray byte pieces dropped, so both engines do and are scored alike.
        texts = [[drop_broken_bytes(self.target.decode(h)) for h in r.hypotheses] for r in results]
        return [hypotheses[0] for hypotheses in texts]


class OnnxEngine(Engine):
    FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}

    def __init__(self, spec: dict):
        super().__init__(spec)
        path = Path(spec["models"]) / self.FILES[spec["precision"]]
        self.translator = generation.load_translator(
            path, provider=spec["device"], threads=spec["threads"], warn=lambda _: None)

    def run(self, lines: list[str], beam: int) -> list[str]:
        if self.force_length:
            return self.run_forced(lines, beam)
        if self.scores or self.n_best > 1:
            found = self.translator.translate_scored(lines, beam, None, batch_size=len(lines),
                                                     n_best=self.n_best)
            return [hyps[0].text if hyps else "" for hyps in found]
        return self.translator.translate(lines, beam, None, batch_size=len(lines))

    def run_forced(self, lines: list[str], beam: int) -> list[str]:
        """Exactly `force_length` new tokens per line: `min_length` = `max_length`."""
        model = self.translator
        src = contract.pad_rows([model.encode(line, i + 1) for i, line in enumerate(lines)],
                                model.pad)
        feeds = contract.search_feeds(src, self.force_length, beam,
                                      float(model.meta["length_penalty"]), scores=self.scores)
        (sequences,) = model.session_for(len(lines)).run(
            ["sequences"], feeds | {"min_length": feeds["max_length"]})
        ids = contract.parse_sequences(sequences, model.pad)
        check_lengths([len(row) for row in ids], self.force_length)
        return decode_ids(model.target, ids, model.eos)


def check_lengths(lengths: list[int], wanted: int) -> None:
    """A forced pass that produced another length would time other work: stop."""
    if set(lengths) != {wanted}:
        sys.exit(f"error: --force-length {wanted}: the engine produced outputs of "
                 f"{sorted(set(lengths))} tokens")


def translate_all(engine, lines: list[str], batch_size: int, beam: int,
                  lengths: dict[int, int]):
    """(translations, seconds): the lines in src.infer's batches (by source tokens)."""
    return common.timed(translate_in_batches, lines, batch_size,
                        lambda idx: engine.run([lines[i] for i in idx], beam), lengths)


ENGINES = {"ours": OnnxEngine, "ours_baseline": OnnxEngine, "ctranslate2": Ct2Engine}


def refuse_foreign_modules(name: str) -> None:
    """A timing process must hold neither torch nor the other engine's runtime."""
    loaded = [m for m in FOREIGN.get(name, ("torch",)) if m in sys.modules]
    if loaded:
        sys.exit(f"error: refusing to time {name}: {', '.join(loaded)} is loaded in this "
                 "process (it slows the engines; run each engine in a process of its own)")


def worker(spec: dict) -> dict:
    """One pass of one engine over every cell of `spec` (beam x batch), in this process:
    {"pid", "modules" (the foreign ones loaded: none), "seconds" per cell, "outputs"}."""
    refuse_foreign_modules(spec["engine"])
    module, _, cls = spec["engine"].partition(":")  # or `module:Class`, a test's fake engine
    engine = (ENGINES.get(spec["engine"]) or getattr(importlib.import_module(module), cls))(spec)
    lines = spec["lines"]
    lengths = {int(i): n for i, n in spec["lengths"].items()}
    seconds, outputs, score_cost = {}, {}, {}
    for beam, size in spec["cells"]:
        if spec.get("score_cost"):
            score_cost[f"{beam},{size}"] = paired_score_cost(engine, lines, size, beam, lengths,
                                                             spec["score_cost"])
            continue
        engine.run(lines[:size], beam)  # warm-up
        out, seconds[f"{beam},{size}"] = translate_all(engine, lines, size, beam, lengths)
        if spec.get("keep_outputs"):
            outputs[f"{beam},{size}"] = out
    refuse_foreign_modules(spec["engine"])  # nothing the engine did pulled one in
    watched = sorted({m for names in FOREIGN.values() for m in names} & set(sys.modules))
    return {"pid": os.getpid(), "modules": watched, "seconds": seconds, "outputs": outputs,
            "score_cost": score_cost}


def paired_score_cost(engine, lines: list[str], size: int, beam: int, lengths: dict[int, int],
                      rounds: int) -> dict:
    """`rounds` pairs of passes without and with scores (`engine.scores`), the order swapped
    each round: each mode's fastest pass (seconds) and each round's ratio, scored / plain."""
    taken = {"plain": [], "scored": []}
    for mode in taken:  # warm-up, both modes
        engine.scores = mode == "scored"
        engine.run(lines[:size], beam)
    for r in range(rounds):
        for mode in (("plain", "scored") if r % 2 == 0 else ("scored", "plain")):
            engine.scores = mode == "scored"
            taken[mode].append(translate_all(engine, lines, size, beam, lengths)[1])
    engine.scores = False
    return {"plain": min(taken["plain"]), "scored": min(taken["scored"]),
            "ratios": [p / s for p, s in zip(taken["plain"], taken["scored"])]}


def run_worker(spec: dict, work: Path) -> dict:
    """`worker(spec)` in a fresh Python process (bench.common's worker protocol)."""
    try:
        return common.run_worker("bench.engines_vs_ctranslate2", spec, work)
    except common.WorkerFailed as exc:
        sys.exit(f"error: the {spec['engine']} worker failed: {exc}")


def refuse_combinations(a: SimpleNamespace) -> None:
    """The combinations of options that cannot be timed, refused as usage errors."""
    if a.n_best > min(ints(a.beams)):
        raise typer.BadParameter(f"--n-best {a.n_best} needs every beam of --beams to be at "
                                 "least that")
    if a.force_length and (a.scores or a.n_best > 1):
        raise typer.BadParameter("--force-length times one unscored translation per sentence: "
                                 "not with --scores or --n-best")
    if a.score_cost and (a.scores or a.n_best > 1 or a.force_length or a.baseline):
        raise typer.BadParameter("--score-cost times each engine with and without scores "
                                 "itself: not with --scores, --n-best, --force-length or "
                                 "--baseline")


class Sitting:
    """One sitting: the test sentences, their source lengths, the converted CTranslate2 model
    and the engines to time, each pass a worker process of its own (`run_worker`)."""

    def __init__(self, args: SimpleNamespace, work: Path):
        self.args, self.work = args, work
        self.precisions = args.precisions.split(",")
        tokenizer_dir = args.models / "tokenizer"
        test = common.test_split(args.split_dir)
        self.sources, self.references = list(test["source"]), list(test["target"])
        self.target_lang = load_tokenizers(tokenizer_dir).target_lang
        # this process times nothing: it may load a model to count source tokens (batching)
        reference = generation.load_translator(args.models / "model.onnx", threads=1,
                                               warn=lambda _: None)
        self.lengths = {i: len(reference.encode(line, i + 1))  # as src.infer batches
                        for i, line in enumerate(self.sources) if line.strip()}
        from src.to_ctranslate2 import convert  # torch, in this process only

        ct2_dir = convert(args.models / "model.pt", tokenizer_dir, work / "ct2")
        self.base = {"models": str(args.models), "ct2_dir": str(ct2_dir),
                     "tokenizer_dir": str(tokenizer_dir), "meta": reference.meta,
                     "device": args.device, "scores": args.scores, "n_best": args.n_best,
                     "force_length": args.force_length}
        self.names = ["ours", "ctranslate2"] + (["ours_baseline"] if args.baseline else [])
        self.lines = self.sources[: args.sentences] if args.sentences else self.sources
        self.cells = [[beam, size] for beam in ints(args.beams) for size in ints(args.batches)]

    def spec(self, name: str, precision: str, threads: int, cells, lines, **extra) -> dict:
        models = str(self.args.baseline) if name == "ours_baseline" else self.base["models"]
        return {**self.base, "engine": name, "precision": precision, "models": models,
                "threads": threads, "cells": cells, "lines": lines,
                "lengths": {i: n for i, n in self.lengths.items() if i < len(lines)}, **extra}

    def passes(self, precision: str, threads: int, cells, lines, repeats: int,
               keep_outputs: bool = False):
        """Each engine `repeats` times, alternating, each pass a new process: the fastest pass
        of each engine and cell, {(name, "beam,batch"): seconds}, and the first's outputs."""
        best: dict[tuple[str, str], float] = {}
        outputs: dict[str, dict] = {}
        for _ in range(repeats):
            for name in self.names:
                result = run_worker(self.spec(name, precision, threads, cells, lines,
                                              keep_outputs=keep_outputs and name not in outputs),
                                    self.work)
                for cell, seconds in result["seconds"].items():
                    best[name, cell] = min(seconds, best.get((name, cell), float("inf")))
                outputs.setdefault(name, result["outputs"])
        return best, outputs

    def rows(self) -> Iterator[dict]:
        """Quality first (not with forced lengths or the cost of scores), then speed or cost."""
        if not (self.args.force_length or self.args.score_cost):
            yield from self.quality_rows()
        yield from (self.score_cost_rows if self.args.score_cost else self.speed_rows)()

    def quality_rows(self) -> Iterator[dict]:
        """The whole test split, beam 4 (or the n-best), batch 32, 2 threads: BLEU, identical."""
        beam = max(4, self.args.n_best)
        for precision in self.precisions:
            _, outputs = self.passes(precision, 2, [[beam, 32]], self.sources, 1,
                                     keep_outputs=True)
            ours, theirs = outputs["ours"][f"{beam},32"], outputs["ctranslate2"][f"{beam},32"]
            yield {"kind": "quality", "precision": precision, "beam": beam, "batch": 32,
                   "sentences": len(self.sources),
                   "bleu_ours": bleu(ours, self.references, self.target_lang),
                   "bleu_ctranslate2": bleu(theirs, self.references, self.target_lang),
                   "identical": round(common.same_share(ours, theirs), 4)}

    def score_cost_rows(self) -> Iterator[dict]:
        """Each engine with and without scores, paired in its own process."""
        for threads in ints(self.args.threads):
            for precision in self.precisions:
                for name in self.names:
                    spec = self.spec(name, precision, threads, self.cells, self.lines,
                                     score_cost=self.args.score_cost)
                    costs = run_worker(spec, self.work)["score_cost"]
                    for beam, size in self.cells:
                        yield score_cost_row(name, precision, threads, beam, size,
                                             len(self.lines), costs[f"{beam},{size}"])

    def speed_rows(self) -> Iterator[dict]:
        """Speed at natural lengths (or forced ones): sent/s of each engine per cell."""
        args = self.args
        for threads in ints(args.threads):
            for precision in self.precisions:
                best, _ = self.passes(precision, threads, self.cells, self.lines, args.repeats)
                for beam, size in self.cells:
                    row = {"kind": "speed", "precision": precision, "threads": threads,
                           "beam": beam, "batch": size, "sentences": len(self.lines),
                           "repeats": args.repeats, "scores": args.scores,
                           "n_best": args.n_best, "force_length": args.force_length}
                    for name in self.names:
                        seconds = best[name, f"{beam},{size}"]
                        row[f"{name}_sent_per_s"] = round(len(self.lines) / seconds, 1)
                    row["ours_vs_ctranslate2"] = round(
                        row["ours_sent_per_s"] / row["ctranslate2_sent_per_s"], 2)
                    if args.baseline:
                        row["ours_vs_baseline"] = round(
                            row["ours_sent_per_s"] / row["ours_baseline_sent_per_s"], 3)
                    yield row


def score_cost_row(engine: str, precision: str, threads: int, beam: int, batch: int,
                   sentences: int, cost: dict) -> dict:
    ratios = sorted(cost["ratios"])
    return {"kind": "score_cost", "engine": engine, "precision": precision,
            "threads": threads, "beam": beam, "batch": batch, "sentences": sentences,
            "rounds": len(ratios), "plain_sent_per_s": round(sentences / cost["plain"], 1),
            "scored_sent_per_s": round(sentences / cost["scored"], 1),
            "scored_vs_plain": round(statistics.median(ratios), 3),
            "ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)]}


def require_gpu() -> None:
    """Both engines must see a GPU, or the comparison would quietly time a CPU."""
    import ctranslate2
    import onnxruntime as ort

    if ctranslate2.get_cuda_device_count() == 0 \
            or placement.CUDA not in ort.get_available_providers():
        sys.exit("error: --device cuda needs a GPU that CTranslate2 sees and onnxruntime-gpu's "
                 "CUDA provider; this machine has "
                 f"{ctranslate2.get_cuda_device_count()} CUDA device(s) for CTranslate2 and "
                 f"providers {', '.join(ort.get_available_providers())}")


app = common.cli_app()


@app.command(help=__doc__)
def main(
    models: Path = typer.Option(paths.MODELS, help="model.pt, the ONNX files, tokenizer/."),
    split_dir: Path = typer.Option(paths.TOKENIZED),
    sentences: int = typer.Option(0, help="Time the first N test sentences (0: all)."),
    threads: str = typer.Option("1,2"),
    beams: str = typer.Option("1,4"),
    batches: str = typer.Option("1,32"),
    precisions: str = typer.Option("fp32,int8", help="Of fp32, int8, fp16 (cuda only)."),
    device: str = typer.Option("cpu", help="cpu | cuda (threads then feed the CPU side only)."),
    repeats: int = typer.Option(3, help="Passes per engine, alternating; the fastest counts."),
    scores: bool = typer.Option(False, "--scores", help="Both engines also return scores."),
    n_best: int = typer.Option(1, help="Scored hypotheses per sentence, both engines."),
    baseline: Path = typer.Option(None, help="Our files from other code: a third engine."),
    force_length: int = typer.Option(None, metavar="L", help="Every output exactly L tokens."),
    score_cost: int = typer.Option(0, metavar="R", help="R rounds without and with scores."),
    json_out: Path = typer.Option(None, "--json", help="Write the rows here."),
    worker_spec: Path = typer.Option(None, "--worker", hidden=True),  # one timing process
) -> None:
    if worker_spec:
        return common.serve_worker(worker_spec, worker)
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter("expected cpu or cuda", param_hint="--device")
    args = SimpleNamespace(**{k: v for k, v in locals().items() if k != "worker_spec"})
    refuse_combinations(args)
    if device == "cuda":
        require_gpu()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for row in Sitting(args, Path(work)).rows():
            rows.append(row)
            print(json.dumps(row), flush=True)
    sitting = common.record(rows=rows)  # with the command, commit and CPU that produced them
    print("\n" + engine_tables.report([sitting]))
    if json_out:
        common.write_json(json_out, sitting, indent=1)


if __name__ == "__main__":
    common.run_cli(app)
