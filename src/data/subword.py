"""Subword tokenizers (SentencePiece) for the two sides, and the special ids every module uses.

`models/tokenizer/` holds `source.model`, `target.model` (the same file twice when the
vocabulary is shared) and `tokenizer.json` with the special ids and languages, so inference
finds everything beside the model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from src.core.errors import PipelineError
from src.core.special_ids import BOS, EOS, PAD, UNK  # noqa: F401 (re-exported)

META = "tokenizer.json"
# Written by tokenize into the encoded data: the digest of the tokenizer that made the ids.
ENCODED_WITH = "tokenizer.sha256"
# With byte_fallback a rare character is several byte pieces (丸 is <0xE4><0xB8><0xB8>); a model
# that emits only some of them decodes to one U+FFFD per stray byte. Every decoder (PyTorch,
# ONNX Runtime, the text-in text-out graph) drops them, as it drops a special id: a missing
# character reads better than a visible error mark.
BROKEN_BYTE = "\ufffd"


def drop_broken_bytes(text: str) -> str:
    return text.replace(BROKEN_BYTE, "")


# Chinese and Japanese put no space between characters, yet a model trained on concatenated pairs
# (`train.concat_ratio`, joined by a space as the method prescribes) writes "是吧。 我也这么认为。"
# for a two-sentence source. Every decoder removes spaces between two CJK characters or CJK
# punctuation marks; a space beside a Latin word ("用 Python 写") stays. BLEU (zh) and chrF
# ignore spaces, so scores do not move. The ranges: CJK radicals, CJK symbols and punctuation,
# kana, bopomofo, CJK ideographs (extension A, unified, compatibility), full-width forms.
CJK_RANGES = ((0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3100, 0x312F), (0x31A0, 0x31FF),
              (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF))
_CJK = "[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES) + "]"
_SPACES_BETWEEN_CJK = re.compile(f"(?<={_CJK}) +(?={_CJK})")


def join_cjk(text: str) -> str:
    return _SPACES_BETWEEN_CJK.sub("", text)


def decode_ids(processor, rows, eos: int = EOS) -> list[str]:
    """Id rows to text, as every decoder does it: special ids (<= EOS) vanish, then stray
    byte pieces (`drop_broken_bytes`), then spaces between CJK characters (`join_cjk`)."""
    # Row by row: for two rows or more, SentencePiece's batch decode starts a thread on every
    # call, even when told one thread, which costs more than decoding the rows (docs/engines.md).
    return [join_cjk(drop_broken_bytes(processor.decode([int(i) for i in row if i > eos])))
            for row in rows]


def tokenizer_digest(tokenizer_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("source.model", "target.model", META):
        path = Path(tokenizer_dir) / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


def check_encoded_with(data_dir: Path, tokenizer_dir: Path) -> None:
    """Encoded data must come from the tokenizer beside it: tokenize replaces the two folders
    one after the other, and a kill in between would pair new ids with an old vocabulary."""
    stamp = Path(data_dir) / ENCODED_WITH
    if not stamp.exists() or stamp.read_text().strip() != tokenizer_digest(tokenizer_dir):
        raise PipelineError(
            f"{data_dir} was not encoded with the tokenizer in {tokenizer_dir} "
            "(an interrupted or older tokenize run): run `dvc repro tokenize` again"
        )


@dataclass
class Tokenizers:
    source: spm.SentencePieceProcessor
    target: spm.SentencePieceProcessor
    meta: dict

    @property
    def source_vocab(self) -> int:
        return self.source.get_piece_size()

    @property
    def target_vocab(self) -> int:
        return self.target.get_piece_size()

    @property
    def source_lang(self) -> str:
        return self.meta["source_lang"]

    @property
    def target_lang(self) -> str:
        """Picks the BLEU tokenizer of train's valid score and of evaluate."""
        return self.meta["target_lang"]

    @property
    def shared_vocab(self) -> bool:
        """One SentencePiece model for both sides: train ties the source embedding too."""
        return bool(self.meta["shared_vocab"])

    def decode_target(self, ids: list[list[int]]) -> list[str]:
        return decode_ids(self.target, ids)


def train_spm(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    byte_fallback: bool,
    seed: int,
    normalization: str = "identity",
    max_sentences: int = 10_000_000,
) -> bytes:
    """Train one SentencePiece model in memory; returns its serialized bytes. `sentences` is
    streamed; beyond `max_sentences` SentencePiece keeps a seeded random sample of them."""
    import io

    spm.set_random_generator_seed(seed)
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buffer,
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            normalization_rule_name=normalization,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            hard_vocab_limit=False,  # tiny corpora get a smaller vocabulary instead of an error
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as exc:
        why = explain_spm_failure(str(exc), vocab_size, character_coverage)
        raise PipelineError(why) from None
    return buffer.getvalue()


def explain_spm_failure(message: str, vocab_size: int, character_coverage: float) -> str:
    """SentencePiece's `INTERNAL: trainer_interface.cc(638) [...]` as a fix a user can make."""
    import re

    too_small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if too_small:
        needed = int(too_small.group(2))
        return (f"tokenize.vocab_size={vocab_size} is too small for this corpus: covering "
                f"tokenize.character_coverage={character_coverage} of its characters takes "
                f"{needed:,} pieces before any subword; raise tokenize.vocab_size above "
                f"{needed + 4:,} (several times that for good subwords) or lower "
                "tokenize.character_coverage")
    text = re.sub(r"^\w+: \S+\(\d+\) \[.*?\] ", "", message.strip().splitlines()[0])
    return f"sentencepiece training failed: {text}"


def load_tokenizers(directory: Path) -> Tokenizers:
    directory = Path(directory)
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
        missing = {"source_lang", "target_lang", "shared_vocab"} - set(meta)
        if missing:
            raise ValueError(f"{META} lacks {', '.join(sorted(missing))}")
        source = spm.SentencePieceProcessor(model_file=str(directory / "source.model"))
        target = spm.SentencePieceProcessor(model_file=str(directory / "target.model"))
    except (OSError, ValueError, RuntimeError) as exc:
        raise PipelineError(f"cannot load tokenizer from {directory}: {exc}") from None
    return Tokenizers(source, target, meta)
