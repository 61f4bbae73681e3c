"""Property-based tests of every parser of user input: any bytes, JSON or YAML value gives a
result or one clean, one-line error (a `PipelineError` naming the line and byte offset, the
params key, or an MLflow 400), never another exception.

Hypothesis runs a fixed number of derandomized examples per property (the same inputs on every
run and in CI); a failure it found is kept below as an `@example` with what it found.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import tempfile
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mlflow.exceptions import MlflowException
from pydantic import BaseModel
from test_serving_inputs import FakeTranslator

from src.core.errors import PipelineError
from src.core.params import SECTIONS, load_params
from src.core.text import decode, iter_lines, read_lines, split_lines
from src.data.corpus import as_utf8_text, extract_corpus, join_sides, read_text_file
from src.data.mixing import CorpusFile, read_corpora
from src.data.splitting import read_pairs
from src.runtime.serving import TranslationModel

REPO = Path(__file__).resolve().parent.parent
PARSER = settings(max_examples=200, deadline=None, derandomize=True)
FILES = settings(max_examples=100, deadline=None, derandomize=True)  # a temp file per example
PAIR = SECTIONS["pair"](source_lang="en", target_lang="zh", source_column=0, target_column=1)
# "not UTF-8 text at line 3, byte offset 1,234 (bytes …)"; the UTF-16 refusal says the same
WHERE = re.compile(r"at line (\d+), byte offset ([\d,]+) \(bytes ([0-9a-f ]*)\)")


def one_line(message: str) -> bool:
    return len(message.splitlines()) == 1 and message.strip() == message


# -- bytes: valid text, the characters that split or end lines, BOMs, invalid bytes ----------
PIECES = st.sampled_from([
    b"\t", b"\n", b"\r\n", b"\r", b"\x00", b" ", codecs.BOM_UTF8, codecs.BOM_UTF16_LE,
    codecs.BOM_UTF16_BE, "\u2028".encode(), "\x85".encode(), "\ufeff".encode(),
    "中文".encode(), "中文".encode("gbk"), b"\xff", b"\xc3", b"\xe4\xb8", b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80", b"\xc0\xaf", "é".encode("latin-1"), b"<html>", b"<!DOCTYPE html>"])
TEXTS = st.text(st.characters(exclude_categories=["Cs"]), max_size=8).map(str.encode)
MIXED = st.lists(PIECES | TEXTS | st.binary(max_size=6), max_size=12).map(b"".join)
BYTES = st.binary(max_size=64) | MIXED | st.lists(PIECES, max_size=8).map(
    lambda pieces: codecs.BOM_UTF16_LE + b"".join(pieces))


def assert_names_the_first_bad_byte(message: str, data: bytes, whole_file: bool = True) -> None:
    """A decoding error names the line and byte offset of the first byte that is not text, and
    shows the bytes there: all before it decodes, nothing from it does. Only the whole-file
    reader (`decode`) honours a UTF-16 BOM; the streamed one reads UTF-8 alone."""
    assert one_line(message), message
    found = WHERE.search(message)
    assert found, message
    line, offset = int(found[1]), int(found[2].replace(",", ""))
    # up to 4 bytes (the streamed reader stops at the line's end)
    assert found[3] and data[offset : offset + 4].hex(" ").startswith(found[3]), message
    utf16 = whole_file and data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    prefix = data[:offset].decode("utf-16" if utf16 else "utf-8-sig")
    assert line == prefix.count("\n") + 1, message
    if not utf16:
        for end in range(offset + 1, min(offset + 4, len(data)) + 1):
            with pytest.raises(UnicodeDecodeError):
                data[offset:end].decode("utf-8")


def error_of(call) -> str | None:
    try:
        call()
    except PipelineError as exc:
        return str(exc)
    return None


@PARSER
@given(BYTES)
# found: a UTF-16 BOM before bytes that are not UTF-16 said so without the line and offset
@example(codecs.BOM_UTF16_BE + b"\x00")
@example(codecs.BOM_UTF16_LE + "a\nb".encode("utf-16-le") + b"\x00\xd8x\x00")  # line 2
def test_any_bytes_decode_to_text_or_one_line_naming_the_first_bad_byte(data):
    try:
        text = decode(data, "corpus.tsv")
    except PipelineError as exc:
        assert str(exc).startswith("corpus.tsv: ")
        assert_names_the_first_bad_byte(str(exc), data)
        return
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    assert text == data.decode("utf-16" if utf16 else "utf-8-sig")


@PARSER
@given(st.text(st.characters(exclude_categories=["Cs"])) | st.lists(
    st.sampled_from(["a", "\n", "\r", "\r\n", "\u2028", "\x85", "\t", "\x0b", ""])).map("".join))
def test_lines_end_at_newline_only_and_lose_one_carriage_return_at_most(text):
    lines = split_lines(text)
    segments = text.split("\n")
    if text.endswith("\n") or not text:
        segments.pop()
    assert len(lines) == len(segments)
    for line, segment in zip(lines, segments):
        assert "\n" not in line and segment in (line, line + "\r")


@PARSER
@given(BYTES)
# found (by the corpus-file property below): a file of a UTF-8 BOM alone streamed as one empty
# line, where the whole-file reader (and a BOM before any text) gives none
@example(codecs.BOM_UTF8)
def test_streamed_lines_are_the_whole_file_lines_and_fail_at_the_same_byte(data):
    """`iter_lines` (stdin, large files) and `decode` + `split_lines` (downloads) agree on any
    bytes that do not start with a UTF-16 BOM (which only the whole-file reader honours)."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        data = b"x" + data
    whole = error_of(lambda: decode(data, "f"))
    try:
        streamed = list(iter_lines(io.BytesIO(data), "f"))
    except PipelineError as exc:
        assert whole is not None, (data, str(exc))
        assert str(exc).startswith("f: ")
        assert_names_the_first_bad_byte(str(exc), data, whole_file=False)
        assert WHERE.search(str(exc)).groups()[:2] == WHERE.search(whole).groups()[:2]
        return
    assert whole is None, whole
    assert streamed == split_lines(decode(data, "f"))


@FILES
@given(BYTES)
def test_any_file_reads_as_lines_or_one_line_naming_the_bad_byte(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "side.en")
        path.write_bytes(data)
        try:
            lines = list(read_lines(path))
        except PipelineError as exc:
            assert str(exc).startswith(f"{path}: ")
            assert_names_the_first_bad_byte(str(exc), data, whole_file=False)
        else:
            assert all("\n" not in line for line in lines)
        try:
            side = read_text_file(path, "https://x/side.en")
        except PipelineError as exc:
            message = str(exc)
            assert one_line(message) and message.startswith("https://x/side.en")
            if "looks like an HTML page" not in message:  # a whole-file verdict: no offset
                assert_names_the_first_bad_byte(message, data)
        else:
            assert side == split_lines(as_utf8_text(data, "s"))


@PARSER
@given(BYTES, st.integers(0, 40))
def test_any_bytes_give_clean_pairs_or_one_line_and_every_line_is_counted(data, max_chars):
    try:
        lines = list(iter_lines(io.BytesIO(data), "corpus.tsv"))
    except PipelineError as exc:
        assert_names_the_first_bad_byte(str(exc), data, whole_file=False)
        return
    read = read_pairs(lines, PAIR, max_chars)
    assert len(read.pairs) + sum(read.dropped.values()) == len(lines)
    assert set(read.dropped) <= {"empty", "malformed", "too_long"}
    for pair in read.pairs:
        for side in pair:
            assert side and side == " ".join(side.split()) and "\ufeff" not in side
            assert "\t" not in side and len(side) <= max_chars


@FILES
@given(BYTES)
@example(codecs.BOM_UTF8)  # found: counted as one line read (and dropped as empty)
def test_any_corpus_file_gives_counted_pairs_or_one_line(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "c.tsv")
        path.write_bytes(data)
        try:
            table, counts = read_corpora([CorpusFile("c", path, 1.0)], PAIR, 300)
        except PipelineError as exc:
            assert_names_the_first_bad_byte(str(exc), data, whole_file=False)
            return
    counts = counts["c"]
    assert counts["read"] == len(split_lines(data.decode("utf-8-sig")))
    assert table.num_rows == counts["read"] - sum(
        counts[f"dropped_{why}"] for why in ("empty", "malformed", "too_long", "duplicate"))
    pairs = list(zip(table["source"].to_pylist(), table["target"].to_pylist()))
    assert len(set(pairs)) == len(pairs)


@FILES
@given(BYTES)
def test_any_download_gives_a_utf8_tsv_or_one_line(data):
    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp, "payload")
        payload.write_bytes(data)
        try:
            corpus = extract_corpus(payload, "", 10**6, "https://x/c.tsv")
        except PipelineError as exc:
            message = str(exc)
            assert one_line(message) and message.startswith("https://x/c.tsv")
            if not re.search("looks like an HTML page|is not a TSV corpus|archive", message):
                assert_names_the_first_bad_byte(message, data)
            return
    text = corpus.decode("utf-8")
    assert "\t" in text and text.lstrip("\ufeff") == as_utf8_text(data, "s")


@FILES
@given(st.lists(BYTES, min_size=2, max_size=3))
def test_one_file_per_language_joins_into_rows_of_one_column_each(sides):
    """The side files of a `{lang}` URL: lines or one line of error each, then one TSV row per
    line with each side in its own column (a tab inside a sentence becomes a space)."""
    with tempfile.TemporaryDirectory() as tmp:
        lines = {}
        for column, data in enumerate(sides):
            path = Path(tmp, f"s{column}")
            path.write_bytes(data)
            try:
                lines[column] = read_text_file(path, f"s{column}")
            except PipelineError as exc:  # named by the property above
                assert one_line(str(exc))
                return
    urls = [f"u{column}" for column in lines]
    if len({len(side) for side in lines.values()}) > 1:
        message = error_of(lambda: join_sides(lines, urls))
        assert message and one_line(message) and "differ in line count" in message
        return
    rows = split_lines(join_sides(lines, urls).decode("utf-8"))
    assert len(rows) == len(lines[0])
    for i, row in enumerate(rows):
        cells = row.split("\t")
        assert len(cells) == len(lines)
        for column, cell in enumerate(cells):
            written = lines[column][i].replace("\t", " ")
            # the last cell's "\r" before the row's "\n" is the line end's
            assert cell == written or (column == len(cells) - 1 and cell + "\r" == written)


# -- JSON requests to the served model -----------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)
SENTENCES = st.lists(st.text(max_size=20), max_size=5) | st.text(max_size=20) | JSON
PARAM_VALUES = (st.integers(0, 5) | st.booleans() | st.integers(-2, 130) | JSON
                | st.sampled_from([None, 2.0, "4", 10**30]))
PARAMS = st.none() | st.dictionaries(
    st.sampled_from(["beam", "max_length", "n_best", "return_scores"]) | st.text(max_size=6),
    PARAM_VALUES, max_size=4) | JSON


@PARSER
@given(SENTENCES, PARAMS)
# found: params that are JSON but not an object (true, [1], "beam") raised AttributeError
# ('bool' object has no attribute 'get'), a 500, instead of a 400
@example([""], True)
@example(["a"], [1])
@example(["a"], "beam")
def test_any_json_request_gives_translations_or_a_400_with_one_line(sentences, params):
    model = TranslationModel()
    model.translator = FakeTranslator()
    # what the HTTP server hands predict: values parsed from JSON text
    sentences, params = json.loads(json.dumps(sentences)), json.loads(json.dumps(params))
    try:
        out = model.predict(None, sentences, params)
    except MlflowException as exc:
        assert exc.get_http_status_code() == 400
        assert one_line(exc.message), exc.message
        return
    sentences = [sentences] if isinstance(sentences, str) else sentences
    assert len(out) == len(sentences)
    for sentence, got in zip(sentences, out):
        translation = got if isinstance(got, str) else got["translation"]
        assert translation == sentence.upper()


# -- params.yaml ----------------------------------------------------------------------------
COMMITTED = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
KEYS = [(section, key) for section, body in COMMITTED.items() for key in body]
ODD = st.sampled_from(["", " ", "yes", "no", "on", "~", "null", "1e3", "0x1F", ".inf", "-.nan",
                       "2001-12-14", "a\nb", "\t", "\ufeff", "中文", "models:/x", "models:/m@a",
                       "models:/m/3", " models:/m@a ", "unigram", "loss", "bf16", "a", "x.tsv"])
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-3, 300)
           | st.floats() | st.floats(0, 2) | ODD | st.text(max_size=10))
ENTRY_KEYS = st.sampled_from(["name", "url", "hub", "sacrebleu", "weight", "max_pairs", "seed",
                              "member", "sha256", "id", "split", "revision", "translation"])
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    ENTRY_KEYS | st.text(max_size=5), inner, max_size=4), max_leaves=10)


def has_type(value, annotation) -> bool:
    """Whether a loaded value is what its field declares (no coercion: 1 is no bool)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(has_type(v, args[0]) for v in value)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return isinstance(value, annotation)
    return type(value) is annotation


def params_file(tmp: str, text: str) -> Path:
    path = Path(tmp, "params.yaml")
    path.write_text(text, encoding="utf-8")
    return path


def assert_typed_or_one_line_naming(key: tuple[str, str], value_written, path: Path,
                                    line_level: bool = False) -> None:
    section, name = key
    kind = SECTIONS[section]
    try:
        loaded = getattr(load_params(kind, path=path), name)
    except PipelineError as exc:
        message = str(exc)
        assert one_line(message), message
        if line_level and re.search(r"is not valid YAML: .*line \d+|line \d+: duplicate key",
                                    message):
            return  # the file does not parse: its line is named (there is no key yet)
        # a cross-field rule (distinct columns, heads dividing d_model, url or corpora) is
        # the section's, and says which keys
        assert f"'{section}.{name}" in message or (
            message.startswith(f"params.yaml: bad value for '{section}': ") and name in message
        ), message
        return
    assert has_type(loaded, kind.model_fields[name].annotation), (loaded, value_written)
    if not isinstance(loaded, (list, BaseModel)) and value_written is not None:
        normalised = value_written.strip() if name == "init_from" else value_written
        assert loaded == normalised  # strict: never coerced (5 -> 5.0 for a float is equal)


@FILES
@given(st.sampled_from(KEYS), VALUES)
# found while writing this test: an unknown key with a newline inside a corpus entry was shown
# as is, a message of two lines ('download.corpora.0.a<newline>b'); now escaped
@example(("download", "corpora"), [{"name": "a", "url": "x.tsv", "a\nb": 1}])
@example(("pair", "source_column"), 1)  # a cross-field rule: distinct columns
def test_any_yaml_value_for_any_key_is_typed_or_one_line_naming_the_key(key, value):
    section, name = key
    raw = {s: dict(body) for s, body in COMMITTED.items()}
    raw[section][name] = value
    with tempfile.TemporaryDirectory() as tmp:
        assert_typed_or_one_line_naming(key, value, params_file(tmp, yaml.safe_dump(raw)))


# YAML text as a user types it after `key:`: flow collections (any node may be a key), anchors,
# tags, quotes and escapes
FLOW_SCALARS = st.sampled_from([
    "1", "-2", "0.5", "1e3", "0x1F", "0o17", "1_000", ".inf", ".nan", "true", "yes", "~", "null",
    "a", "'a b'", '"a\\nb"', '"\\t"', '""', "2001-12-14", "!!binary aGk=", "!!str 1",
    "!!float 1", "!!int x", "!!bool x", "!!timestamp x", "!!python/name:os.system", "&x 1",
    "*x", "中文", "[", "}", ":", "- a", "|", ">", "#c", "@", "`", "%", "? a"])
TAGS = st.sampled_from(["", "!!map ", "!!set ", "!!seq ", "!!omap ", "!!pairs ", "!!str "])


def flow_nodes(inner):
    """A node around `inner` ones: tagged, a flow sequence, a flow mapping, a complex key."""
    return (st.tuples(TAGS, inner).map("".join)
            | st.lists(inner, max_size=3).map(lambda items: f"[{', '.join(items)}]")
            | st.lists(st.tuples(inner, inner), max_size=3).map(
                lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}")
            | st.tuples(inner, inner).map(lambda kv: f"{{? {kv[0]} : {kv[1]}}}"))


FLOW = st.recursive(FLOW_SCALARS, flow_nodes, max_leaves=6)


@FILES
@given(st.sampled_from(KEYS), FLOW)
# found: a tag that does not fit its text raised PyYAML's ValueError (`!!int x`, and
# `!!float 1#…` where a comment follows without a space) instead of a YAML error naming the line
@example(("train", "lr"), "!!int x")
@example(("train", "lr"), "!!float 1#c")
# found, same cause: KeyError (`!!bool x`), AttributeError (`!!timestamp x`), TypeError
# (`!!map [1]`, `!!set [a]`: a sequence where a mapping is due)
@example(("train", "lr"), "!!bool x")
@example(("train", "lr"), "!!timestamp x")
@example(("train", "lr"), "!!map [1]")
@example(("train", "lr"), "!!set [a]")
# found: a mapping used as a key raised TypeError (unhashable type: 'list' / 'dict') from the
# duplicate-key check instead of the YAML error PyYAML itself gives
@example(("train", "lr"), "{[1]: 2}")
@example(("train", "lr"), "{? {a: 1} : 2}")
# found while writing this test: a duplicate key with a newline inside was shown as is, a
# message of two lines
@example(("train", "lr"), '{"a\\nb": 1, "a\\nb": 2}')
def test_any_yaml_text_after_a_key_is_typed_or_one_line(key, text):
    section, name = key
    committed = (REPO / "params.yaml").read_text(encoding="utf-8")
    line = re.compile(rf"^(  {name}:)[^#\n]*", re.MULTILINE)
    start = re.search(rf"^{section}:", committed, re.MULTILINE).end()
    found = line.search(committed, start)
    edited = committed[: found.start()] + f"{found[1]} {text} " + committed[found.end():]
    with tempfile.TemporaryDirectory() as tmp:
        assert_typed_or_one_line_naming(key, None, params_file(tmp, edited), line_level=True)
