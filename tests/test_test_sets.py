"""Named test sets (download.test_sets): fetched at download time from a URL, the Hub or
sacreBLEU's API, kept whole, their sources kept out of training, each its own split."""

from __future__ import annotations

import json

import pytest
from datasets import load_from_disk
from helpers import assert_one_line_error, run_stage, scratch_root, write_pairs
from hub_repos import flores_like, offline_env, sacrebleu_set

PAIRS = [(f"Sentence {i}.", f"第{i}句。") for i in range(40)]
NEWS = [("The market rose.", "市场上涨了。"), ("Sentence 3.", "第三句。")]


def corpus_file(tmp_path):
    return write_pairs(tmp_path / "corpus.tsv", PAIRS)


def named_root(tmp_path, test_sets: list[dict]):
    return scratch_root(tmp_path / "p", split={"valid_size": 4, "test_size": 4},
                        download={"url": str(corpus_file(tmp_path)), "test_sets": test_sets})


def env(tmp_path):
    return offline_env(tmp_path / "hub") | {"SACREBLEU": str(tmp_path / "sacrebleu")}


def test_each_named_set_is_its_own_split_and_out_of_training(tmp_path):
    sacrebleu_set(tmp_path / "sacrebleu", "wmt20", "en-zh", NEWS)
    flores_like(tmp_path / "hub", PAIRS[5:8])
    local = tmp_path / "local.tsv"
    local.write_text("Sentence 9.\t第九句。\n", encoding="utf-8")
    root = named_root(tmp_path, [
        {"name": "wmt20", "sacrebleu": "wmt20"},
        {"name": "flores", "hub": {"id": "test-org/flores-mini", "split": "dev",
                                   "configs": ["eng_Latn", "cmn_Hans"], "revision": "main"}},
        {"name": "mine", "url": str(local)}])
    result = run_stage(root, "download", env=env(tmp_path))
    assert result.returncode == 0, result.stderr
    meta = json.loads((root / "data/download.json").read_text())
    assert [t["name"] for t in meta["test_sets"]] == ["wmt20", "flores", "mine"]
    assert meta["test_sets"][0]["sacrebleu"] == "wmt20" and meta["test_sets"][0]["urls"]
    assert "commit" in meta["test_sets"][1]["hub"]
    assert run_stage(root, "split").returncode == 0
    splits = load_from_disk(str(root / "data/split"))
    assert list(splits["test_wmt20"]["source"]) == [en for en, _ in NEWS]
    assert list(splits["test_wmt20"]["target"]) == [zh for _, zh in NEWS]
    assert len(splits["test_flores"]) == 3 and len(splits["test_mine"]) == 1
    held_out = {"Sentence 3.", "Sentence 5.", "Sentence 6.", "Sentence 7.", "Sentence 9."}
    for part in ("train", "valid", "test"):
        assert not held_out & set(splits[part]["source"]), part
    stats = json.loads((root / "data/split_stats.json").read_text())
    assert stats["corpora"]["corpus"]["dropped_in_test_set"] == 5
    assert stats["n_test_wmt20"] == 2


@pytest.mark.parametrize("spec, fragment", [
    ({"sacrebleu": "wmt99"}, "sacreBLEU has no test set 'wmt99'; the sets with en-zh: "),
    ({"sacrebleu": "wmt14"}, "sacreBLEU has no en-zh in wmt14; the sets with en-zh: "),
])
def test_a_sacrebleu_set_without_the_pair_lists_those_with_it(tmp_path, spec, fragment):
    """Checked before anything is fetched: the corpus URL here cannot be reached."""
    root = scratch_root(tmp_path / "p", download={"url": "http://127.0.0.1:9/corpus.zip",
                                                  "test_sets": [{"name": "news"} | spec]})
    result = run_stage(root, "download", env=env(tmp_path))
    assert_one_line_error(result, fragment)
    assert "wmt20" in result.stderr
    assert not (root / "data/raw").exists()


def test_two_test_sets_with_one_name_are_refused(tmp_path):
    root = named_root(tmp_path, [{"name": "a", "sacrebleu": "wmt20"},
                                 {"name": "a", "sacrebleu": "wmt21"}])
    assert_one_line_error(run_stage(root, "download"), "two test sets are named 'a'")
