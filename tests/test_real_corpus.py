"""download + split on the real cmn-eng archive in ../shared/data (skipped only if absent)."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA
from helpers import run_stage, scratch_root

ARCHIVE = SHARED_DATA / "cmn-eng" / "cmn-eng.zip"
CMN_TXT_SHA256 = "aa264a2447b26ab7c9d413f8321f9e2a779fd134b5118306b6e26a3499b3926e"


@pytest.mark.skipif(not ARCHIVE.exists(), reason=f"{ARCHIVE} not present")
def test_download_and_split_real_corpus(tmp_path):
    from datasets import load_from_disk

    root = scratch_root(tmp_path, download={"url": str(ARCHIVE)})
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    meta = json.loads((root / "data/raw/download.json").read_text())
    assert meta["corpus_sha256"] == CMN_TXT_SHA256
    assert meta["corpus_lines"] == 29156

    result = run_stage(root, "split")
    assert result.returncode == 0, result.stderr
    counts = json.loads((root / "data/split_metrics.json").read_text())
    assert counts["sources_valid"] == 1000 and counts["sources_test"] == 2000
    assert counts["dropped_empty"] == 1  # the trailing empty line
    assert counts["n_train"] + counts["n_valid"] + counts["n_test"] == counts["kept"]
    splits = load_from_disk(str(root / "data/split"))
    english = {name: set(splits[name]["source"]) for name in ("train", "valid", "test")}
    assert not english["train"] & english["test"]
    assert not english["train"] & english["valid"]
    assert not english["valid"] & english["test"]
    # cmn.txt has English sentences with several translations: they stay together
    assert counts["n_test"] > counts["sources_test"]
