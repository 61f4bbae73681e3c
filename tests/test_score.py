"""Scoring given translations (`python -m src.score`, models/model.score.onnx) on the exported
toy project: PyTorch's teacher-forced log-probabilities, and bad pairs in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from helpers import assert_one_line_error, run_stage

from src.nmt import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


# -- scoring given translations (src.score, models/model.score.onnx) ------------------------------
def test_the_scoring_file_gives_pytorchs_teacher_forced_log_probabilities(project, tmp_path):
    from datasets import load_from_disk

    from src.graph.likelihood_graph import token_logprobs

    test = load_from_disk(str(project / "data/tokenized"))["test"]
    pairs = list(zip(test["source"], test["target"]))[:30]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    result = run_stage(project, "score", str(tsv), "--onnx",
                       str(project / "models/model.score.onnx"), "--format", "jsonl",
                       "--batch-size", "7")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["source"], r["target"]) for r in records] == pairs
    model, _ = checkpoint.load_model(project / "models/model.pt")
    for record, src_ids, tgt_ids in zip(records, test["source_ids"], test["target_ids"]):
        want = token_logprobs(model, torch.tensor([list(src_ids) + [3]]),
                              torch.tensor([list(tgt_ids) + [3]]))[0].tolist()
        assert record["tokens"] == len(want) and record["pieces"][-1] == "</s>"
        assert max(abs(a - b) for a, b in zip(record["token_logprobs"], want)) < 1e-4
        assert record["logprob"] == pytest.approx(sum(want), abs=1e-3)


def test_a_reference_is_likelier_than_its_garbled_copy(project, tmp_path):
    """The score orders translations as it must: each test reference against the same
    characters shuffled."""
    from datasets import load_from_disk

    test = load_from_disk(str(project / "data/tokenized"))["test"]
    rng = random.Random(0)
    rows = []
    for source, target in list(zip(test["source"], test["target"]))[:40]:
        garbled = "".join(rng.sample(target, len(target)))
        rows += [f"{source}\t{target}\n", f"{source}\t{garbled}\n"]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(rows), encoding="utf-8")
    result = run_stage(project, "score", str(tsv), "--onnx",
                       str(project / "models/model.score.onnx"))
    assert result.returncode == 0, result.stderr
    means = [float(line.split("\t")[2]) for line in result.stdout.splitlines()]
    better = sum(ref > garbled for ref, garbled in zip(means[::2], means[1::2]))
    assert better >= 36  # of 40 (a shuffle can leave a short reference nearly as it was)


@pytest.mark.parametrize("content, fragment", [
    ("Hello.\t你好。\nno tab here\n", "line 2: 1 column(s), expected source<TAB>target"),
    ("Hello.\t\n", "line 1: empty target"),
    ("", "holds no pairs"),
])
def test_score_refuses_bad_pairs_in_one_line(project, tmp_path, content, fragment):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(content, encoding="utf-8")
    out = tmp_path / "scores.tsv"
    result = run_stage(project, "score", str(tsv), "--onnx",
                       str(project / "models/model.score.onnx"), "--output", str(out))
    assert_one_line_error(result, fragment)
    assert not out.exists()
