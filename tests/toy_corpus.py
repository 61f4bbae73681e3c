"""A tiny English–Chinese corpus written for the tests: templated sentences with known
translations, so a small model can learn it in seconds and a broken recipe shows up as low BLEU.
"""

from __future__ import annotations

import itertools

NUMBERS = [
    ("one", "一"),
    ("two", "两"),
    ("three", "三"),
    ("four", "四"),
    ("five", "五"),
    ("six", "六"),
    ("seven", "七"),
    ("eight", "八"),
    ("nine", "九"),
    ("ten", "十"),
]
ANIMALS = [
    ("cats", "猫"),
    ("dogs", "狗"),
    ("birds", "鸟"),
    ("fish", "鱼"),
    ("horses", "马"),
    ("rabbits", "兔子"),
]
SINGULAR = {
    "cats": "cat",
    "dogs": "dog",
    "birds": "bird",
    "fish": "fish",
    "horses": "horse",
    "rabbits": "rabbit",
}
PEOPLE = [
    ("I", "我"),
    ("You", "你"),
    ("He", "他"),
    ("She", "她"),
    ("We", "我们"),
    ("They", "他们"),
]
VERBS = [("have", "has", "有"), ("see", "sees", "看见"), ("like", "likes", "喜欢")]
MEASURE = {
    "cats": "只",
    "dogs": "只",
    "birds": "只",
    "fish": "条",
    "horses": "匹",
    "rabbits": "只",
}


def toy_pairs() -> list[tuple[str, str]]:
    """All combinations: 'She likes three dogs.' -> '她喜欢三只狗。' (1,080 pairs)."""
    pairs = []
    for (p_en, p_zh), (v_en, v3_en, v_zh), (n_en, n_zh), (a_en, a_zh) in itertools.product(
        PEOPLE, VERBS, NUMBERS, ANIMALS
    ):
        verb = v3_en if p_en in {"He", "She"} else v_en
        animal = SINGULAR[a_en] if n_en == "one" else a_en
        pairs.append(
            (f"{p_en} {verb} {n_en} {animal}.", f"{p_zh}{v_zh}{n_zh}{MEASURE[a_en]}{a_zh}。")
        )
    return pairs


def toy_tsv(attribution: str = "CC-BY 2.0 (France) test fixture") -> str:
    return "".join(f"{en}\t{zh}\t{attribution}\n" for en, zh in toy_pairs())
