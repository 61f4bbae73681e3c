"""Corpus scores with sacreBLEU, the tokenizer chosen from the target language.

One home for the choice, so evaluate, export and train's checkpoint selection score alike.
"""

from __future__ import annotations


def bleu_tokenizer(target_lang: str) -> str:
    """sacreBLEU's tokenizer for a target language: character-level for CJK, 13a otherwise."""
    lang = target_lang.lower().split("-")[0]
    if lang in {"zh", "cmn"}:
        return "zh"
    if lang in {"ja", "ko"}:
        return "char"
    return "13a"


def bleu(hypotheses: list[str], references: list[str], target_lang: str) -> float:
    import sacrebleu

    tokenize = bleu_tokenizer(target_lang)
    return round(sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize).score, 2)


def score(hypotheses: list[str], references: list[str], target_lang: str) -> dict[str, float]:
    """Corpus BLEU, chrF and BLEU's brevity penalty."""
    import sacrebleu

    result = sacrebleu.corpus_bleu(hypotheses, [references], tokenize=bleu_tokenizer(target_lang))
    chrf = sacrebleu.corpus_chrf(hypotheses, [references])
    return {
        "bleu": round(result.score, 2),
        "chrf": round(chrf.score, 2),
        "bleu_brevity_penalty": round(result.bp, 4),
    }
