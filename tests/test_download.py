"""download: local paths, file:// URLs, zip or plain TSV; bad input ends in one clear line."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
from helpers import assert_one_line_error, run_stage, scratch_root
from loopback import CORPUS, raw_server, replies

from src.core.errors import PipelineError
from src.data.transport import redirect_target


def test_plain_tsv_by_local_path(tmp_path, toy_tsv):
    root = scratch_root(tmp_path / "p", download={"url": str(toy_tsv)})
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    corpus = root / "data/raw/corpus.tsv"
    assert corpus.read_bytes() == toy_tsv.read_bytes()
    meta = json.loads((root / "data/download.json").read_text())["corpora"][0]
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
    meta = json.loads((root / "data/download.json").read_text())["corpora"][0]
    assert meta["payload_sha256"] == [hashlib.sha256(archive.read_bytes()).hexdigest()]
    # no predefined test set: no file (an empty declared output made DVC warn on every run)
    assert not (root / "data/raw/test.tsv").exists()


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
    meta = json.loads((root / "data/download.json").read_text())
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
    assert_one_line_error(run_stage(root, "download"), "not UTF-8 text at line 2")


def test_text_without_tabs_is_rejected(tmp_path):
    text = tmp_path / "words.txt"
    text.write_text("just words, one sentence per line\nand no translation\n")
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


# -- HTTP failure paths, against a raw socket server on loopback ------------------------------

def http_download(tmp_path, url: str, **download):
    root = scratch_root(tmp_path / "p", download={"url": url, **download})
    return root, run_stage(root, "download")


def test_truncated_http_body_is_refused(tmp_path):
    """A server promised 7,600 bytes and sent 387: this used to exit 0 with a broken corpus."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 7600\r\nConnection: close\r\n\r\n"
    with raw_server(replies(head + CORPUS[:387])) as base:
        root, result = http_download(tmp_path, f"{base}/cmn.txt")
    assert_one_line_error(result, "download failed")
    assert "387" in result.stderr and "7,600" in result.stderr
    assert not (root / "data/raw/corpus.tsv").exists()


@pytest.mark.parametrize("response", [
    b"garbage instead of a status line\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc",  # broken chunking
    b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n" + CORPUS,
])
def test_http_protocol_errors_are_one_line(tmp_path, response):
    with raw_server(replies(response)) as base:
        _, result = http_download(tmp_path, f"{base}/cmn.txt")
    assert_one_line_error(result, "download failed")


def test_a_bad_port_in_the_url_is_one_line(tmp_path):
    _, result = http_download(tmp_path, "http://127.0.0.1:abc/cmn.txt")
    assert_one_line_error(result, "download failed")


def test_a_trickling_server_hits_the_total_deadline(tmp_path):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n"
    with raw_server(replies(head, *[b"x"] * 40, delay_s=0.1)) as base:
        _, result = http_download(tmp_path, f"{base}/cmn.txt", timeout_s=1)
    assert_one_line_error(result, "did not finish within download.timeout_s=1 s")


def test_payload_over_max_bytes_is_refused(tmp_path):
    big = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(CORPUS) + CORPUS
    unsized = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + CORPUS  # no Content-Length
    for response in (big, unsized):
        with raw_server(replies(response)) as base:
            _, result = http_download(tmp_path, f"{base}/cmn.txt", max_bytes=1000)
        assert_one_line_error(result, "larger than download.max_bytes")


def test_redirects_are_followed_but_never_to_plain_http_from_https(tmp_path):
    def respond(conn, path):
        if path == "/old":
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /new/cmn.txt\r\n"
                         b"Content-Length: 0\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(CORPUS) + CORPUS)

    with raw_server(respond) as base:
        root, result = http_download(tmp_path, f"{base}/old")
    assert result.returncode == 0, result.stderr
    assert (root / "data/raw/corpus.tsv").read_bytes() == CORPUS
    assert redirect_target("https://a.org/x", "/y") == "https://a.org/y"
    with pytest.raises(PipelineError, match="redirects to insecure http://a.org/y"):
        redirect_target("https://a.org/x", "http://a.org/y")


def test_credentials_and_presigned_queries_are_never_shown(tmp_path):
    secret = "http://user:hunter2@127.0.0.1:9/cmn.zip?X-Amz-Signature=deadbeef"
    _, result = http_download(tmp_path, secret)
    assert_one_line_error(result, "http://***@127.0.0.1:9/cmn.zip?***")
    assert "hunter2" not in result.stderr and "deadbeef" not in result.stderr
    with raw_server(replies(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(CORPUS)
                            + CORPUS)) as base:
        url = base.replace("http://", "http://user:hunter2@") + "/cmn.txt?sig=deadbeef"
        root, result = http_download(tmp_path, url)
    assert result.returncode == 0, result.stderr
    recorded = (root / "data/download.json").read_text()
    assert "hunter2" not in recorded and "deadbeef" not in recorded and "***" in recorded


# -- archives and text ------------------------------------------------------------------------

def zipped(tmp_path, name: str, data: bytes, method=zipfile.ZIP_DEFLATED):
    archive = tmp_path / "corpus.zip"
    with zipfile.ZipFile(archive, "w", compression=method) as zf:
        zf.writestr(name, data)
    return archive


def test_a_zip_bomb_member_is_refused(tmp_path):
    archive = zipped(tmp_path, "cmn.txt", b"Hi.\t\xe5\x97\xa8\n" * 300_000)  # 2.4 MB -> ~4 KB
    assert archive.stat().st_size < 50_000
    _, result = http_download(tmp_path, str(archive), max_bytes=1_000_000)
    assert_one_line_error(result, "unzips to")


def test_a_corrupt_zip_member_is_one_line(tmp_path):
    archive = zipped(tmp_path, "cmn.txt", CORPUS)
    data = bytearray(archive.read_bytes())
    data[60:80] = b"\xff" * 20  # inside the deflate stream
    archive.write_bytes(bytes(data))
    _, result = http_download(tmp_path, str(archive))
    assert_one_line_error(result, "cmn.txt")


def test_an_encrypted_zip_member_is_one_line(tmp_path):
    archive = zipped(tmp_path, "cmn.txt", CORPUS, method=zipfile.ZIP_STORED)
    data = bytearray(archive.read_bytes())
    data[6] |= 1  # general-purpose flag bit 0 (encrypted), local header ...
    central = data.rfind(b"PK\x01\x02")
    data[central + 8] |= 1  # ... and central directory
    archive.write_bytes(bytes(data))
    _, result = http_download(tmp_path, str(archive))
    assert_one_line_error(result, "cannot be read")


def test_a_gbk_zip_member_is_refused_with_line_and_offset(tmp_path):
    archive = zipped(tmp_path, "cmn.txt", "Hi.\t嗨。\nTea.\t茶。\n".encode("gbk"))
    _, result = http_download(tmp_path, str(archive))
    assert_one_line_error(result, "cmn.txt: not UTF-8 text at line 1, byte offset 4")


def test_invalid_bytes_after_64_kib_are_refused_at_download(tmp_path):
    corpus = tmp_path / "big.tsv"
    corpus.write_bytes(CORPUS * 20 + b"Bad.\t\xff\n")
    assert len(CORPUS) * 20 > 1 << 16
    _, result = http_download(tmp_path, str(corpus))
    assert_one_line_error(result, "not UTF-8 text at line 8001")


def test_utf16_with_a_bom_becomes_utf8(tmp_path):
    corpus = tmp_path / "utf16.tsv"
    corpus.write_bytes(CORPUS.decode("utf-8").encode("utf-16"))
    root, result = http_download(tmp_path, str(corpus))
    assert result.returncode == 0, result.stderr
    assert (root / "data/raw/corpus.tsv").read_bytes() == CORPUS


def test_an_html_page_with_a_tab_is_not_a_corpus(tmp_path):
    page = tmp_path / "login"
    page.write_text("<!DOCTYPE html>\n<html><body>\tSign in</body></html>\n")
    _, result = http_download(tmp_path, str(page))
    assert_one_line_error(result, "looks like an HTML page")


def test_a_lang_url_with_other_braces_and_u2028(tmp_path):
    """`{year}` used to raise KeyError; U+2028 inside a sentence used to split it."""
    folder = tmp_path / "{year}"
    folder.mkdir()
    (folder / "train.en").write_text("Para\u2028graph .\nTwo .\n", encoding="utf-8")
    (folder / "train.vi").write_text("Đoạn .\nHai .\n", encoding="utf-8")
    pair = {"source_lang": "en", "target_lang": "vi", "source_column": 0, "target_column": 1}
    root = scratch_root(tmp_path / "p", pair=pair,
                        download={"url": str(folder / "train.{lang}")})
    result = run_stage(root, "download")
    assert result.returncode == 0, result.stderr
    assert (root / "data/raw/corpus.tsv").read_text(encoding="utf-8").split("\n") == [
        "Para\u2028graph .\tĐoạn .", "Two .\tHai .", ""]


def test_sha256_pins_the_corpus(tmp_path, toy_tsv):
    wrong = "0" * 64
    root, result = http_download(tmp_path, str(toy_tsv), sha256=wrong)
    assert_one_line_error(result, f"download.sha256 mismatch: expected {wrong}")
    assert not (root / "data/raw/corpus.tsv").exists()
    right = hashlib.sha256(toy_tsv.read_bytes()).hexdigest()
    _, result = http_download(tmp_path / "again", str(toy_tsv), sha256=right)
    assert result.returncode == 0, result.stderr
