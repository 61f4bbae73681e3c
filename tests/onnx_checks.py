"""What the slow tests of the exported toy project's files share: `src.infer` on the project, a
session of a file, and PyTorch's score of a hypothesis by forced decoding (the searches' rule)."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import run_stage
from toy_projects import EXPORT

from src.core.special_ids import BANNED, BOS, EOS
from src.nmt.model import Transformer


def infer(project: Path, *args: str, stdin: str | None = None, model: Path | None = None):
    model = model or project / "models/model.onnx"
    return run_stage(project, "infer", "--onnx", str(model), *args, stdin=stdin)


def infer_bleu(project: Path, model: Path) -> float:
    """BLEU of `src.infer --input` on the project's test split, beam as exported."""
    import sacrebleu
    from datasets import load_from_disk

    test = load_from_disk(str(project / "data/tokenized"))["test"]
    sources = project / "test.en"
    sources.write_text("".join(s + "\n" for s in test["source"]), encoding="utf-8")
    result = infer(project, "--input", str(sources), "--batch-size", str(EXPORT["batch_size"]),
                   model=model)
    assert result.returncode == 0, result.stderr
    hyps = result.stdout.splitlines()
    return round(sacrebleu.corpus_bleu(hyps, [list(test["target"])], tokenize="zh").score, 2)


def session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def forced_log_probs(model: Transformer, source: list[int], tokens: list[int]) -> torch.Tensor:
    """(len(tokens), V) log-probabilities of the fp32 model, `tokens` fed in after BOS (teacher
    forcing), PAD, BOS and UNK at -inf as the searches mask them."""
    with torch.no_grad():
        logits = model(torch.tensor([source]), torch.tensor([[BOS] + tokens[:-1]]))[0].float()
    logits[:, list(BANNED)] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


def ended(ids: list[int], max_len: int) -> list[int]:
    """A hypothesis's tokens as the search generated them: with its EOS when it ended before
    `max_len`; one of `max_len` tokens was cut there (an EOS would have been token max_len + 1)."""
    return ids + [EOS] if len(ids) < max_len else ids


def forced_score(model: Transformer, source: list[int], ids: list[int], max_len: int,
                 length_penalty: float) -> float:
    """PyTorch's score of the hypothesis `ids` (no BOS, no EOS) of one source row, whichever
    search found it: src.nmt.search's sum(log p) / length**length_penalty, length its tokens + 1
    (its EOS, whose log p counts, or the limit it was cut at: 30ee771)."""
    tokens = ended(ids, max_len)
    if not tokens:  # max_len 0: nothing generated, as the search scores it
        return 0.0
    logp = forced_log_probs(model, source, tokens)
    total = float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())
    return total / (len(ids) + 1) ** length_penalty


def parting_gap(model: Transformer, source: list[int], a: list[int], b: list[int],
                max_len: int) -> float:
    """Two different greedy hypotheses of one source: how far apart the fp32 model puts the two
    tokens at the first position where they part (EOS counted), given the prefix they share."""
    a, b = ended(a, max_len), ended(b, max_len)
    j = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    logp = forced_log_probs(model, source, a[: j + 1])[j]
    return abs(float(logp[a[j]] - logp[b[j]]))
