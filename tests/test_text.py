"""src/core/text.py in process: what becomes lines, and exactly where undecodable bytes are
named (the stage tests cover the same through the CLI)."""

from __future__ import annotations

import codecs

import pytest

from src.core.errors import PipelineError
from src.core.text import decode, iter_lines, read_lines, split_lines

GBK = "中文".encode("gbk")  # not UTF-8: d6 d0 ce c4


def test_utf8_with_and_without_a_bom_and_utf16_with_one_decode():
    assert decode(b"a\tb\n", "f") == "a\tb\n"
    assert decode(codecs.BOM_UTF8 + "é".encode(), "f") == "é"
    assert decode("中\n".encode("utf-16"), "f") == "中\n"  # with its BOM


def test_whole_file_errors_name_the_line_offset_and_bytes():
    data = b"ok\nfine\nbad " + GBK + b"\n"
    with pytest.raises(PipelineError) as info:
        decode(data, "corpus.tsv")
    assert str(info.value) == (
        "corpus.tsv: not UTF-8 text at line 3, byte offset 12 (bytes d6 d0 ce c4); "
        "re-encode it as UTF-8 (e.g. iconv -f GBK -t UTF-8)")
    # after a UTF-8 BOM the offset still counts from the file's first byte
    with pytest.raises(PipelineError, match=r"line 1, byte offset 5 "):
        decode(codecs.BOM_UTF8 + b"ab" + GBK, "f")


def test_a_utf16_bom_on_bytes_that_are_not_utf16_is_refused():
    with pytest.raises(PipelineError, match="f: starts with a UTF-16 byte-order mark but is not "
                                            "valid UTF-16"):
        decode(codecs.BOM_UTF16_LE + b"\x00", "f")


def test_lines_end_at_newline_only():
    assert split_lines("ab\r\nb\u2028c\rd\n\ne\n") == ["ab", "b\u2028c\rd", "", "e"]
    assert split_lines("no newline") == ["no newline"]
    assert split_lines("") == []


def test_streamed_lines_drop_a_first_bom_and_name_the_bad_line(tmp_path):
    raw = [codecs.BOM_UTF8 + b"one\r\n", b"two\n", codecs.BOM_UTF8 + b"three"]
    assert list(iter_lines(raw, "s")) == ["one", "two", "\ufeffthree"]  # only the first BOM
    lines = [b"first\n", b"second\n", b"x " + GBK + b"\n"]
    with pytest.raises(PipelineError) as info:
        list(iter_lines(lines, "stdin"))
    assert "stdin: not UTF-8 text at line 3, byte offset 15 (bytes d6 d0 ce c4)" in str(info.value)
    path = tmp_path / "in.txt"
    path.write_bytes(codecs.BOM_UTF8 + b"a\nb\r\n")
    assert list(read_lines(path)) == ["a", "b"]
    path.write_bytes(b"ok\n" + GBK)
    with pytest.raises(PipelineError, match=f"{path}: not UTF-8 text at line 2, byte offset 3"):
        list(read_lines(path))
