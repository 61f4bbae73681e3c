"""Strict text decoding: one place that turns bytes into lines, or says exactly where it cannot.

Every corpus, test set and stdin line goes through here. UTF-8 is the only encoding we guess:
a UTF-8 BOM is dropped, a UTF-16 BOM is honoured (Windows tools write it), and anything else
that is not valid UTF-8 (GBK, Latin-1, binary) is refused with the file, line and byte offset,
instead of being replaced by U+FFFD and trained on. Lines end at "\\n" only (a trailing "\\r" is
dropped): `str.splitlines` would also break at a lone "\\r", U+2028 or U+0085 inside a sentence
and shift every later pair. Standard library only, so `src.infer` can use it.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from pathlib import Path

from src.core.errors import PipelineError

_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def _refuse(source: str, data: bytes, line_start: int, exc: UnicodeDecodeError,
            line_no: int | None = None) -> PipelineError:
    offset = line_start + exc.start
    if line_no is None:
        line_no = data[: exc.start].count(b"\n") + 1
    bad = data[exc.start : exc.start + 4].hex(" ")
    return PipelineError(
        f"{source}: not UTF-8 text at line {line_no}, byte offset {offset:,} (bytes {bad}); "
        "re-encode it as UTF-8 (e.g. iconv -f GBK -t UTF-8)"
    )


def decode(data: bytes, source: str) -> str:
    """Whole-file decode: UTF-8 (BOM dropped) or UTF-16 with a BOM; anything else refused."""
    if data.startswith(_UTF16_BOMS):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:  # offsets count from the file's first byte
            line_no = data[: exc.start].decode("utf-16").count("\n") + 1
            bad = data[exc.start : exc.start + 4].hex(" ")
            raise PipelineError(f"{source}: starts with a UTF-16 byte-order mark but is not "
                                f"valid UTF-16 at line {line_no}, byte offset {exc.start:,} "
                                f"(bytes {bad}); re-encode it as UTF-8") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = 3 if data.startswith(codecs.BOM_UTF8) else 0
        # utf-8-sig reports offsets after the BOM
        exc = UnicodeDecodeError(exc.encoding, data, exc.start + start, exc.end + start,
                                 exc.reason)
        raise _refuse(source, data, 0, exc) from None


def split_lines(text: str) -> list[str]:
    """Lines ending at "\\n" (a "\\r" before it dropped); no empty line after a final newline."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def iter_lines(raw_lines: Iterable[bytes], source: str) -> Iterator[str]:
    """Strictly decoded lines of a UTF-8 byte stream (a file opened "rb", sys.stdin.buffer).

    Streams: memory stays flat however long the file, and an error names the line at once.
    """
    offset = 0
    for line_no, raw in enumerate(raw_lines, start=1):
        body = raw[3:] if line_no == 1 and raw.startswith(codecs.BOM_UTF8) else raw
        if not body:  # a file of a BOM alone: no line, as `decode` + `split_lines` read it
            return
        try:
            line = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(source, body, offset + len(raw) - len(body), exc, line_no) from None
        offset += len(raw)
        if line.endswith("\n"):
            line = line[:-1]
        yield line[:-1] if line.endswith("\r") else line


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file, streamed (see `iter_lines`)."""
    with Path(path).open("rb") as fh:
        yield from iter_lines(fh, str(path))
