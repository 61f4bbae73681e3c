"""Protobuf's wire format, read and written by hand: the runtime reads an ONNX file's metadata
and edits its top-level graph without the `onnx` package (the served model does not install
it) and without parsing the subgraphs it leaves alone."""

from __future__ import annotations

LENGTH_DELIMITED, VARINT = 2, 0


def _varint(data, pos: int, end: int) -> tuple[int, int]:
    """The base-128 varint at data[pos] (before `end`); (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def spans(data, start: int = 0, end: int | None = None):
    """(field number, wire type, value, field start) of the protobuf message in
    data[start:end]: ints for varint and fixed-size fields, (start, end) offsets into `data`
    for length-delimited ones, so that a large field (the graph) is skipped, never copied;
    `field start` is where the field's key begins (to cut the whole field out)."""
    pos, end = start, len(data) if end is None else end
    while pos < end:
        begin = pos
        key, pos = _varint(data, pos, end)
        field, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _varint(data, pos, end)
        elif wire == LENGTH_DELIMITED:
            length, pos = _varint(data, pos, end)
            value, pos = (pos, pos + length), pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = int.from_bytes(data[pos: pos + size], "little"), pos + size
        else:
            raise ValueError(f"wire type {wire}")
        if pos > end:
            raise ValueError("a field runs past the end")
        yield field, wire, value, begin


def fields(data, start: int = 0, end: int | None = None):
    """`spans` without the field starts: (field number, wire type, value)."""
    for field, wire, value, _ in spans(data, start, end):
        yield field, wire, value


def varint(value: int) -> bytes:
    """`value` (>= 0) as a base-128 varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(field: int, wire: int) -> bytes:
    """A field's key: its number and wire type."""
    return varint(field << 3 | wire)


def field_bytes(field: int, value: int | bytes) -> bytes:
    """One field: an int as a varint, bytes as a length-delimited value."""
    if isinstance(value, int):
        return key(field, VARINT) + varint(value)
    return key(field, LENGTH_DELIMITED) + varint(len(value)) + value
