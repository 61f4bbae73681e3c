"""CC-CEDICT as a corpus: each English gloss of an entry paired with its simplified headword
(`黃瓜 黄瓜 [huang2 gua1] /cucumber/CL:根[gen1]/` gives cucumber -> 黄瓜), filtered as a
lexicographer reads the glosses (the download stage's work for `format: cedict` corpora).

A gloss is a translation only when it is one. Dropped: cross-references ("variant of 碗[wan3]",
"see …", "used in …"), surname notes, classifier notes ("CL:…"), abbreviation notes ("abbr. for
…"), literal readings of idioms ("lit. …") and descriptions ("place name", "name of a river").
Parenthesised explanations ("(slang)", "(Tw)") are cut off and the rest kept; a gloss left empty
by that, one still holding Chinese characters (a reference in disguise) or one of more than
`max_words` words (an explanation, not a translation) is dropped. "/" separates senses and ";"
the renderings of one sense: each is a gloss here. Entries whose headword holds no Chinese
character ("3C", "%") give no pairs. Every drop is counted by its reason, a gloss once, by the
first reason that drops it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from src.core.errors import PipelineError

ENTRY = re.compile(r"(?P<traditional>\S+) (?P<simplified>\S+) \[(?P<pinyin>[^\]]*)\] "
                   r"/(?P<glosses>.*)/")
HEADER_FIELD = re.compile(r"#! (?P<key>\w+)=(?P<value>.*)")
# Han ideographs (unified, extension A, compatibility): a headword needs one, a gloss holding
# one is a reference to another entry
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
CROSS_REFERENCE = re.compile(
    r"(old |archaic |ancient |erhua |japanese |euphemistic |loanword |also )?"
    r"(variant of|see|see also|same as|used in|written as|also written|also pr\.|"
    r"cf\.)\b", re.IGNORECASE)
# "abbr. for 北京大學|北京大学[…]": the entry abbreviates another and its gloss names no English
ABBREVIATION = re.compile(r"(\([^)]*\)\s*)?abbr\.", re.IGNORECASE)
PARENTHESISED = re.compile(r"\([^()]*\)")  # innermost first, so nested ones go too
# what a gloss says about the headword instead of translating it ("place name", "name of a river")
DESCRIPTION = re.compile(r"(place name|name of|a kind of|a type of|a species of)\b",
                         re.IGNORECASE)
DROP_REASONS = ("cross_reference", "surname", "classifier", "abbreviation", "literal",
                "parenthesised", "chinese_in_gloss", "description", "too_long")


@dataclass
class Dictionary:
    entries: int = 0
    pairs: int = 0
    no_chinese_headword: int = 0  # entries that give no pairs
    dropped: Counter = field(default_factory=Counter)  # glosses, by DROP_REASONS
    explanations_cut: int = 0  # glosses kept without their parenthesised explanation
    header: dict[str, str] = field(default_factory=dict)  # the "#! key=value" lines

    def counts(self) -> dict[str, int]:
        """What data/download.json and the stage's summary line show."""
        return {"entries": self.entries, "pairs": self.pairs,
                "no_chinese_headword": self.no_chinese_headword,
                **{f"dropped_{why}": self.dropped.get(why, 0) for why in DROP_REASONS},
                "explanations_cut": self.explanations_cut}

    def licence(self) -> dict[str, str]:
        """Licence and attribution as the file's header states them (CC-CEDICT's own lines)."""
        publisher = self.header.get("publisher", "")
        return {"license": self.header.get("license", "not stated in the file's header"),
                "attribution": "CC-CEDICT" + (f", published by {publisher}" if publisher else "")
                + "; CEDICT © 1997, 1998 Paul Andrew Denisowski",
                "dictionary_date": self.header.get("date", "")}


def renderings(glosses: str) -> list[str]:
    """An entry's glosses one by one: "/" separates senses, ";" outside parentheses the
    renderings of one sense ("trisomy; Down's syndrome")."""
    out, depth, start = [], 0, 0
    for i, char in enumerate(glosses):
        depth += (char == "(") - (char == ")")
        if char == "/" or (char == ";" and depth <= 0):
            out.append(glosses[start:i])
            start, depth = i + 1, 0 if char == "/" else depth
    return [*out, glosses[start:]]


def gloss_translation(gloss: str, max_words: int) -> tuple[str, str]:
    """(the English a gloss translates to, "") or ("", the reason it translates nothing)."""
    gloss = gloss.strip()
    if CROSS_REFERENCE.match(gloss):
        return "", "cross_reference"
    if gloss.lower().startswith("surname "):
        return "", "surname"
    if gloss.startswith("CL:"):
        return "", "classifier"
    if ABBREVIATION.match(gloss):
        return "", "abbreviation"
    if gloss.lower().startswith("lit. "):
        return "", "literal"
    text = gloss.removeprefix("fig. ")
    while (cut := PARENTHESISED.sub(" ", text)) != text:
        text = cut
    text = " ".join(text.split()).strip(" ,;")
    if not text:
        return "", "parenthesised"
    if HAN.search(text):
        return "", "chinese_in_gloss"
    if DESCRIPTION.match(text):
        return "", "description"
    if len(text.split()) > max_words:
        return "", "too_long"
    return text, ""


def dictionary_pairs(lines: Iterable[str], source: str, max_words: int,
                     found: Dictionary) -> Iterator[tuple[str, str]]:
    """(English, simplified headword) per kept gloss of each entry of CC-CEDICT's text, lines
    split at "\\n"; counts and header fields go into `found`. A line that is neither a comment
    nor an entry fails with its file and line number."""
    for line_no, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        if line.startswith("#"):
            if header := HEADER_FIELD.fullmatch(line):
                found.header[header["key"]] = header["value"].strip()
            continue
        entry = ENTRY.fullmatch(line)
        if not entry:
            raise PipelineError(f"{source}, line {line_no}: not a CC-CEDICT entry (want "
                                f"'Traditional Simplified [pin1 yin1] /gloss/…/'): "
                                f"{line[:80]!r}")
        found.entries += 1
        headword = entry["simplified"]
        if not HAN.search(headword):
            found.no_chinese_headword += 1
            continue
        for gloss in renderings(entry["glosses"]):
            if not gloss.strip():
                continue
            english, why = gloss_translation(gloss, max_words)
            if why:
                found.dropped[why] += 1
                continue
            if english != gloss.strip():
                found.explanations_cut += 1
            found.pairs += 1
            yield english, headword
