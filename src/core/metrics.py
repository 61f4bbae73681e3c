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


def score(hypotheses: list[str], references: list[str], target_lang: str,
          signatures: bool = False) -> dict[str, float]:
    """Corpus BLEU, chrF and BLEU's brevity penalty; with `signatures`, sacreBLEU's signature
    of each (what makes a score comparable with a published one)."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu_metric, chrf_metric = BLEU(tokenize=bleu_tokenizer(target_lang)), CHRF()
    result = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    scores = {
        "bleu": round(result.score, 2),
        "chrf": round(chrf.score, 2),
        "bleu_brevity_penalty": round(result.bp, 4),
    }
    if signatures:
        scores |= {"bleu_signature": str(bleu_metric.get_signature()),
                   "chrf_signature": str(chrf_metric.get_signature())}
    return scores


def sentence_chrf(hypotheses: list[str], references: list[str]) -> list[float]:
    """chrF of each sentence on its own (what a confidence should predict)."""
    import sacrebleu

    return [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(hypotheses, references,
                                                                   strict=True)]


def length_bucket(source: str, buckets) -> str:
    """The name of the (name, min_words, max_words or None) bucket holding `source`."""
    words = len(source.split())
    for name, low, high in buckets:
        if words >= low and (high is None or words <= high):
            return name
    return buckets[0][0]  # an empty source counts with the shortest


def score_by_length(sources: list[str], hypotheses: list[str], references: list[str],
                    target_lang: str, buckets) -> dict[str, float]:
    """BLEU and chrF of each source-length bucket, and its sentence count; empty buckets are
    left out (a score of nothing would read as a score of zero)."""
    grouped: dict[str, tuple[list[str], list[str]]] = {}
    for source, hyp, ref in zip(sources, hypotheses, references, strict=True):
        hyps, refs = grouped.setdefault(length_bucket(source, buckets), ([], []))
        hyps.append(hyp)
        refs.append(ref)
    result: dict[str, float] = {}
    for name, _, _ in buckets:
        if name in grouped:
            scores = score(*grouped[name], target_lang)
            result |= {f"bleu_{name}": scores["bleu"], f"chrf_{name}": scores["chrf"],
                       f"sentences_{name}": len(grouped[name][0])}
    return result
