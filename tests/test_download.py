"""download: local paths, file:// URLs, zip or plain TSV; bad input ends in one clear line."""

from __future__ import annotations

import hashlib
import json
import zipfile

from helpers import assert_one_line_error, run_stage, scratch_root


def test_plain_tsv_by_local_path(tmp_path, toy_tsv):
    root = scratch_root(tmp_path / "p", download={"url": str(toy_tsv)})
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    corpus = root / "data/raw/corpus.tsv"
    assert corpus.read_bytes() == toy_tsv.read_bytes()
    meta = json.loads((root / "data/raw/download.json").read_text())["corpus"]
    assert meta["corpus_sha256"] == hashlib.sha256(toy_tsv.read_bytes()).hexdigest()
    assert meta["corpus_bytes"] == toy_tsv.stat().st_size
    assert meta["corpus_lines"] == 1080


def test_zip_by_file_url_picks_the_corpus_member(tmp_path, toy_tsv):
    archive = tmp_path / "cmn-eng.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("_about.txt", "about this corpus, much text " * 1000)
        zf.write(toy_tsv, "cmn.txt")
    root = scratch_root(tmp_path / "p", download={"url": archive.as_uri()})
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    assert (root / "data/raw/corpus.tsv").read_bytes() == toy_tsv.read_bytes()
    meta = json.loads((root / "data/raw/download.json").read_text())["corpus"]
    assert meta["payload_sha256"] == [hashlib.sha256(archive.read_bytes()).hexdigest()]
    assert (root / "data/raw/test.tsv").read_bytes() == b""  # no predefined test set


def write_sides(folder, name: str, en: list[str], vi: list[str], bom: bool = False) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    (folder / f"{name}.vi").write_text(("\ufeff" if bom else "") + "\n".join(vi) + "\n",
                                       encoding="utf-8")
    return str(folder / (name + ".{lang}"))


def test_parallel_files_and_a_predefined_test_set(tmp_path):
    train = write_sides(tmp_path / "d", "train", ["Hello .", "A\ttab ."], ["Xin chào .", "Một ."])
    test = write_sides(tmp_path / "d", "tst", ["Thanks ."], ["Cảm ơn ."], bom=True)
    pair = {"source_lang": "en", "target_lang": "vi", "source_column": 0, "target_column": 1}
    root = scratch_root(tmp_path / "p", pair=pair, download={"url": train, "test_url": test})
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    raw = root / "data/raw"
    assert (raw / "corpus.tsv").read_text() == "Hello .\tXin chào .\nA tab .\tMột .\n"
    assert (raw / "test.tsv").read_text() == "Thanks .\tCảm ơn .\n"  # BOM dropped
    meta = json.loads((raw / "download.json").read_text())
    assert meta["test"]["urls"] == [test.format(lang="en"), test.format(lang="vi")]


def test_parallel_files_written_in_swapped_columns(tmp_path):
    train = write_sides(tmp_path / "d", "train", ["Hello ."], ["Xin chào ."])
    pair = {"source_lang": "en", "target_lang": "vi", "source_column": 1, "target_column": 0}
    root = scratch_root(tmp_path / "p", pair=pair, download={"url": train})
    assert run_stage(root, "download").returncode == 0
    assert (root / "data/raw/corpus.tsv").read_text() == "Xin chào .\tHello .\n"


def test_parallel_files_of_different_length(tmp_path):
    train = write_sides(tmp_path / "d", "train", ["One .", "Two ."], ["Một ."])
    pair = {"source_lang": "en", "target_lang": "vi", "source_column": 0, "target_column": 1}
    root = scratch_root(tmp_path / "p", pair=pair, download={"url": train})
    assert_one_line_error(run_stage(root, "download"), "differ in line count")
    assert not (root / "data/raw/corpus.tsv").exists()


def test_missing_file(tmp_path):
    root = scratch_root(tmp_path, download={"url": str(tmp_path / "nope.zip")})
    assert_one_line_error(run_stage(root, "download"), "no such file")
    assert not (root / "data/raw/corpus.tsv").exists()


def test_unreachable_url_fails_fast_and_leaves_nothing(tmp_path):
    # port 9 (discard) on loopback: connection refused at once, no network needed
    root = scratch_root(
        tmp_path, download={"url": "http://127.0.0.1:9/cmn-eng.zip", "timeout_s": 5}
    )
    assert_one_line_error(run_stage(root, "download"), "cannot reach")
    raw = root / "data/raw"
    assert not raw.exists() or not any(raw.iterdir())


def test_binary_garbage_is_rejected(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 10)
    root = scratch_root(tmp_path / "p", download={"url": str(junk)})
    assert_one_line_error(run_stage(root, "download"), "neither a zip archive nor UTF-8 text")


def test_text_without_tabs_is_rejected(tmp_path):
    text = tmp_path / "page.html"
    text.write_text("<html>not a corpus</html>\n")
    root = scratch_root(tmp_path / "p", download={"url": str(text)})
    assert_one_line_error(run_stage(root, "download"), "not a TSV corpus")


def test_zip_without_corpus_member(tmp_path):
    archive = tmp_path / "empty.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("image.png", b"\x89PNG")
    root = scratch_root(tmp_path / "p", download={"url": str(archive)})
    assert_one_line_error(run_stage(root, "download"), "no .txt/.tsv corpus file")


def test_unknown_param_is_one_line(tmp_path):
    root = scratch_root(tmp_path, download={"mirror": "x"})
    assert_one_line_error(run_stage(root, "download"), "unknown key 'download.mirror'")
