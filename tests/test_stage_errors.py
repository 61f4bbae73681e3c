"""Bad input at stage level: one `error:` line, exit 1, and no half-written output."""

from __future__ import annotations

import pytest
from helpers import assert_one_line_error, run_stage, scratch_root


def test_corpus_with_no_valid_line(tmp_path):
    root = scratch_root(tmp_path)
    corpus = root / "data/raw/corpus.tsv"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("just words\n\n\t\n", encoding="utf-8")
    assert_one_line_error(run_stage(root, "split"), "no valid")
    assert not (root / "data/split").exists()


@pytest.mark.parametrize(
    "stage, missing",
    [
        ("split", "data/raw/corpus.tsv"),
        ("tokenize", "data/split"),
        ("train", "data/tokenized"),
        ("evaluate", "models/model.pt"),
    ],
)
def test_missing_upstream_output(tmp_path, stage, missing):
    result = run_stage(scratch_root(tmp_path), stage)
    assert_one_line_error(result, missing)


def test_corrupt_model_for_evaluate(tmp_path):
    root = scratch_root(tmp_path)
    (root / "models/tokenizer").mkdir(parents=True)
    (root / "data/tokenized").mkdir(parents=True)
    (root / "models/model.pt").write_bytes(b"PK\x03\x04 not really a checkpoint")
    assert_one_line_error(run_stage(root, "evaluate"), "corrupt checkpoint")


def test_help_explains_each_stage(tmp_path):
    for stage in ("download", "split", "tokenize", "train", "evaluate"):
        result = run_stage(scratch_root(tmp_path), stage, "--help")
        assert result.returncode == 0 and "params" in result.stdout.lower(), stage
