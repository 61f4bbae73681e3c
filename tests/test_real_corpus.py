"""download + split on the real corpora in ../shared/data (skipped only if absent): the cmn-eng
archive, and IWSLT'15 en-vi as one text file per language with a predefined test set."""

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
    meta = json.loads((root / "data/download.json").read_text())["corpora"][0]
    assert meta["corpus_sha256"] == CMN_TXT_SHA256
    assert meta["corpus_lines"] == 29156

    result = run_stage(root, "split")
    assert result.returncode == 0, result.stderr
    counts = json.loads((root / "data/split_stats.json").read_text())
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


IWSLT = SHARED_DATA / "iwslt15-en-vi"


@pytest.mark.skipif(not (IWSLT / "tst2013.vi").exists(), reason=f"{IWSLT} not present")
def test_en_vi_parallel_files_with_predefined_test_set(tmp_path):
    from datasets import load_from_disk

    root = scratch_root(
        tmp_path,
        pair={"source_lang": "en", "target_lang": "vi", "source_column": 0, "target_column": 1},
        download={"url": str(IWSLT / "tst2012.{lang}"), "test_url": str(IWSLT / "tst2013.{lang}")},
        split={"valid_size": 100},
    )
    for stage in ("download", "split"):
        result = run_stage(root, stage)
        assert result.returncode == 0, result.stderr
    counts = json.loads((root / "data/split_stats.json").read_text())
    assert counts["predefined_test"] == 1
    assert counts["n_test"] == 1268  # tst2013 whole: no length limit, no dedupe
    assert counts["sources_valid"] == 100
    splits = load_from_disk(str(root / "data/split"))
    assert splits["test"][0]["source"].startswith("When I was little")
    assert "\ufeff" not in splits["test"][0]["source"]  # the file's BOM is gone
    test_sources = set(splits["test"]["source"])
    assert not test_sources & set(splits["train"]["source"])
    assert not test_sources & set(splits["valid"]["source"])
