"""Scores: the tokenizer each target language gets, rounding, and scores by source length (each
sentence lands in the bucket of its word count)."""

from __future__ import annotations

import pytest

from src.core.metrics import bleu, bleu_tokenizer, length_bucket, score, score_by_length
from src.core.reports import LENGTH_BUCKETS
from src.evaluate import length_side


def words(n: int) -> str:
    return " ".join(["word"] * n)


def test_bucket_edges():
    assert [length_bucket(words(n), LENGTH_BUCKETS) for n in (1, 6, 7, 9, 10, 40)] == [
        "le6w", "le6w", "7to9w", "7to9w", "ge10w", "ge10w"]
    assert length_bucket("", LENGTH_BUCKETS) == "le6w"


def test_each_bucket_is_scored_on_its_own_sentences():
    # short sentences translated perfectly, long ones entirely wrong, no 7-9 word sentence
    sources = [words(3), words(12), words(4), words(15)]
    references = ["我们喜欢三只猫。", "他们昨天在火车站等了很久的朋友。", "她有两条鱼。",
                  "如果明天下雨我们就在家里看书和听音乐。"]
    hypotheses = [references[0], "狗", references[2], "马"]
    scores = score_by_length(sources, hypotheses, references, "zh", LENGTH_BUCKETS)
    assert scores["bleu_le6w"] == 100.0 and scores["chrf_le6w"] == 100.0
    assert scores["bleu_ge10w"] == 0.0
    assert scores["sentences_le6w"] == 2 and scores["sentences_ge10w"] == 2
    assert not any(key.endswith("7to9w") for key in scores)  # empty, not a score of zero


def test_chinese_to_english_is_bucketed_by_the_english_reference():
    # the en→zh test pairs, flipped: each pair must land in the same bucket in both directions
    english = [words(3), words(12)]
    chinese = ["我们喜欢三只猫。", "他们昨天在火车站等了很久的朋友。"]
    flipped = length_side(chinese, english, "zh", "en")
    assert [length_bucket(t, LENGTH_BUCKETS) for t in flipped] == ["le6w", "ge10w"]
    assert length_side(english, chinese, "en", "zh") == english
    assert length_side(english, english, "en", "en") == english  # no flip when both are English


@pytest.mark.parametrize("lang, tokenizer", [
    ("zh", "zh"), ("ZH-tw", "zh"), ("cmn", "zh"), ("CMN", "zh"), ("ja", "char"), ("JA", "char"),
    ("ko", "char"), ("ko-KR", "char"), ("en", "13a"), ("vi", "13a"), ("de-CH", "13a")])
def test_the_bleu_tokenizer_follows_the_target_language(lang, tokenizer):
    assert bleu_tokenizer(lang) == tokenizer


def test_scores_use_that_tokenizer_and_keep_two_decimals():
    """A Chinese hypothesis without spaces scores by character (zh), not as one 13a word; the
    figures are sacreBLEU's, rounded to 2 decimals (4 for the brevity penalty)."""
    import sacrebleu

    hyps, refs = ["我们喜欢猫和狗。", "他在"], ["我们喜欢猫。", "他今天在家。"]
    raw = sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh")
    # figures whose rounding shows at the digit kept
    assert round(raw.score, 2) != round(raw.score, 3) and round(raw.bp, 4) != round(raw.bp, 5)
    assert bleu(hyps, refs, "zh") == round(raw.score, 2)
    assert bleu(hyps, refs, "zh") != bleu(hyps, refs, "en")
    scores = score(hyps, refs, "zh")
    chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
    assert scores == {"bleu": round(raw.score, 2), "chrf": round(chrf, 2),
                      "bleu_brevity_penalty": round(raw.bp, 4)}


def test_buckets_refuse_lists_of_different_lengths():
    with pytest.raises(ValueError):
        score_by_length([words(3), words(4)], ["猫"], ["猫", "狗"], "zh", LENGTH_BUCKETS)


def test_signatures_name_the_tokenizer_and_come_only_when_asked():
    plain = score(["猫在这里。"], ["猫在这里。"], "zh")
    assert set(plain) == {"bleu", "chrf", "bleu_brevity_penalty"}
    signed = score(["猫在这里。"], ["猫在这里。"], "zh", signatures=True)
    assert {k: signed[k] for k in plain} == plain
    assert "tok:zh" in signed["bleu_signature"] and signed["bleu_signature"].startswith("nrefs:1")
    assert signed["chrf_signature"].startswith("nrefs:1") and "nc:6" in signed["chrf_signature"]


def test_each_sentence_gets_its_own_chrf_against_its_own_reference():
    from src.core.metrics import sentence_chrf

    got = sentence_chrf(["the cat sat", "a dog", "xyz"], ["the cat sat", "the dog", "abc"])
    assert got[0] == 100.0 and got[2] == 0.0 and 0 < got[1] < 100
    assert sentence_chrf(["a dog"], ["the dog"]) == [got[1]]
    with pytest.raises(ValueError):
        sentence_chrf(["one", "two"], ["one"])  # a missing reference is an error, not a skip
