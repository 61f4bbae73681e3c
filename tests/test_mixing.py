"""Several corpora mixed by weight into one split (src/data/mixing.py), in process: the exact
copies a weight promises, the counts kept per corpus, and no training pair whose source a test
set holds. (tests/test_hub_corpora.py runs the same through the download and split stages.)"""

from __future__ import annotations

from collections import Counter

import pytest

from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams
from src.data import mixing
from src.data.mixing import CorpusFile, mix

PAIR = PairParams(source_lang="en", target_lang="zh", source_column=0, target_column=1)


def cfg(**kw) -> SplitParams:
    return SplitParams(**({"seed": 0, "valid_size": 3, "test_size": 4, "max_chars": 40} | kw))


def corpus(tmp_path, name: str, pairs: list[tuple[str, str]], weight: float = 1.0,
           extra_lines: tuple[str, ...] = (), **kind) -> CorpusFile:
    path = tmp_path / f"{name}.tsv"
    lines = [f"{s}\t{t}" for s, t in pairs] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return CorpusFile(name, path, weight, **kind)


def pairs_of(table) -> list[tuple[str, str]]:
    return list(zip(table["source"].to_pylist(), table["target"].to_pylist()))


def numbered(prefix: str, n: int) -> list[tuple[str, str]]:
    return [(f"{prefix} sentence {i}.", f"{prefix}句子{i}。") for i in range(n)]


# -- mix: the parts and the counts -------------------------------------------------------------

def test_weights_give_exact_training_counts_and_leave_valid_and_test_alone(tmp_path):
    news = corpus(tmp_path, "news", numbered("news", 40), weight=2.0)
    web = corpus(tmp_path, "web", numbered("web", 30), weight=0.5)
    once = mix([news, web], PAIR, cfg())
    plain = mix([corpus(tmp_path, "news", numbered("news", 40)),
                 corpus(tmp_path, "web", numbered("web", 30))], PAIR, cfg())
    # weights never change what is scored
    assert pairs_of(once.parts["valid"]) == pairs_of(plain.parts["valid"])
    assert pairs_of(once.parts["test"]) == pairs_of(plain.parts["test"])
    counts = once.counts
    for name, weight in (("news", 2.0), ("web", 0.5)):
        got = counts[name]
        assert got["kept"] == got["train"] + got["valid"] + got["test"]
        assert got["train_weighted"] == 2 * got["train"] if weight == 2.0 else round(
            0.5 * got["train"])
    assert counts["news"]["read"] == 40 and counts["web"]["read"] == 30
    assert counts["news"]["kept"] + counts["web"]["kept"] == 70
    assert sum(c["valid"] for c in counts.values()) == len(once.parts["valid"]) == 3
    assert sum(c["test"] for c in counts.values()) == len(once.parts["test"]) == 4
    train = Counter(pairs_of(once.parts["train"]))
    assert sum(train.values()) == counts["news"]["train_weighted"] + counts["web"][
        "train_weighted"]
    assert {n for p, n in train.items() if p[0].startswith("news")} == {2}
    assert {n for p, n in train.items() if p[0].startswith("web")} == {1}
    web_train = [p for p in pairs_of(plain.parts["train"]) if p[0].startswith("web")]
    assert len([p for p in train if p[0].startswith("web")]) == round(0.5 * len(web_train))


def test_a_mix_is_reproducible_for_a_seed_and_moves_with_it(tmp_path):
    def run(seed):
        parts = mix([corpus(tmp_path, "a", numbered("a", 30), weight=1.5),
                     corpus(tmp_path, "b", numbered("b", 20), weight=0.25)], PAIR,
                    cfg(seed=seed)).parts
        return {name: pairs_of(table) for name, table in parts.items()}

    first = run(3)
    assert first == run(3)
    assert first != run(4)


def test_a_shared_pair_belongs_to_the_first_corpus_and_counts_as_the_others_duplicate(
        tmp_path):
    shared = numbered("shared", 5)
    first = corpus(tmp_path, "first", numbered("one", 20) + shared)
    second = corpus(tmp_path, "second", shared + numbered("two", 20), weight=3.0)
    mixed = mix([first, second], PAIR, cfg())
    assert mixed.counts["first"]["dropped_duplicate"] == 0
    assert mixed.counts["second"]["dropped_duplicate"] == 5
    assert mixed.counts["first"]["kept"] == 25 and mixed.counts["second"]["kept"] == 20
    train = Counter(pairs_of(mixed.parts["train"]))
    assert all(train[p] == 1 for p in shared if p in train)  # the first corpus's weight, 1


def test_sources_of_a_predefined_test_set_and_of_named_test_sets_never_train(tmp_path):
    pairs = numbered("x", 30)
    test = [pairs[0], ("x sentence 1.", "另一个翻译。")]  # a source, with another translation
    held_out = frozenset({pairs[2][0], pairs[3][0]})
    mixed = mix([corpus(tmp_path, "c", pairs, weight=2.0)], PAIR, cfg(), test=test,
                held_out=held_out)
    left_out = {pairs[0][0], pairs[1][0]} | held_out
    for part in ("train", "valid"):
        assert not {s for s, _ in pairs_of(mixed.parts[part])} & left_out
    assert pairs_of(mixed.parts["test"]) == test  # the predefined set, as given
    got = mixed.counts["c"]
    assert got["dropped_in_test_set"] == 4
    assert got["test"] == 0 and got["valid"] == 3 and got["train"] == 30 - 4 - 3
    assert got["kept"] == 23 + 3 and got["train_weighted"] == 2 * got["train"]


def test_without_a_predefined_test_set_the_held_out_sources_still_never_train(tmp_path):
    pairs = numbered("y", 30)
    held_out = frozenset({pairs[5][0]})
    mixed = mix([corpus(tmp_path, "c", pairs)], PAIR, cfg(), held_out=held_out)
    every = [s for part in mixed.parts.values() for s, _ in pairs_of(part)]
    assert pairs[5][0] not in every
    assert mixed.counts["c"]["dropped_in_test_set"] == 1
    assert len(mixed.parts["test"]) == mixed.counts["c"]["test"] == 4


def test_a_train_fraction_counts_the_unused_training_sources(tmp_path):
    mixed = mix([corpus(tmp_path, "c", numbered("z", 47))], PAIR, cfg(train_fraction=0.5))
    got = mixed.counts["c"]
    assert got["train"] == 20 and got["unused_by_train_fraction"] == 20  # of 40 training
    assert got["kept"] == 27 and len(mixed.parts["train"]) == 20


def test_drops_are_counted_per_corpus_beside_the_parts(tmp_path):
    noisy = corpus(tmp_path, "noisy", numbered("n", 20),
                   extra_lines=("", "no tab", "x" * 41 + "\ty", "n sentence 0.\tn句子0。"))
    got = mix([noisy], PAIR, cfg()).counts["noisy"]
    assert {k: v for k, v in got.items() if k.startswith("dropped_")} == {
        "dropped_empty": 1, "dropped_malformed": 1, "dropped_too_long": 1,
        "dropped_duplicate": 1, "dropped_in_test_set": 0}
    assert got["read"] == 24 and got["kept"] == 20


def test_corpora_without_one_valid_line_are_one_line_naming_them(tmp_path):
    empty = corpus(tmp_path, "empty", [], extra_lines=("no tab here",))
    blank = corpus(tmp_path, "blank", [], extra_lines=("",))
    with pytest.raises(PipelineError) as caught:
        mix([empty, blank], PAIR, cfg())
    assert str(caught.value) == (f"{empty.path}, {blank.path}: no valid 'en<TAB>zh' line found")


def test_two_distinct_pairs_that_share_a_digest_are_both_kept():
    import pyarrow as pa

    table = pa.table({"source": ["a", "c", "a"], "target": ["b", "d", "b"],
                      "digest": pa.array([7, 7, 9], pa.int64())})
    assert mixing.first_occurrences(table).tolist() == [True, True, True]
    twice = pa.table({"source": ["a", "a"], "target": ["b", "b"],
                      "digest": pa.array([7, 7], pa.int64())})
    assert mixing.first_occurrences(twice).tolist() == [True, False]


def test_a_last_corpus_that_adds_nothing_still_gets_its_counts(tmp_path):
    pairs = numbered("p", 20)
    first = corpus(tmp_path, "first", pairs)
    echo = corpus(tmp_path, "echo", pairs[:5], weight=2.0)  # every pair a duplicate
    got = mix([first, echo], PAIR, cfg()).counts["echo"]
    assert got["read"] == 5 and got["dropped_duplicate"] == 5
    assert got["kept"] == got["train"] == got["train_weighted"] == 0


# -- a corpus weighted per epoch, a corpus that only trains ------------------------------------

def test_a_corpus_weighted_per_epoch_is_written_once_and_marked_with_its_weight(tmp_path):
    news = corpus(tmp_path, "news", numbered("news", 40))
    words = corpus(tmp_path, "words", numbered("word", 30), weight=0.2, per_epoch=True)
    mixed = mix([news, words], PAIR, cfg())
    train = mixed.parts["train"]
    marks = dict(zip(pairs_of(train), train["drawn_weight"].to_pylist()))
    assert len(marks) == train.num_rows  # each pair once: the weight is not applied here
    counts = mixed.counts
    assert counts["news"]["train"] + counts["words"]["train"] == train.num_rows
    assert sorted(set(marks.values())) == [0.0, pytest.approx(0.2)]
    assert sum(mark > 0 for mark in marks.values()) == counts["words"]["train"]
    assert all(mark == 0 for pair, mark in marks.items() if pair[0].startswith("news"))
    # counted as one epoch draws it
    assert counts["words"]["train_weighted"] == round(0.2 * counts["words"]["train"])
    # without such a corpus the part is the two text columns it always was
    plain = mix([news, corpus(tmp_path, "words", numbered("word", 30), 0.2)], PAIR, cfg())
    assert plain.parts["train"].column_names == ["source", "target"]


def test_a_train_only_corpus_leaves_valid_and_test_as_the_others_make_them(tmp_path):
    news = numbered("news", 40)
    without = mix([corpus(tmp_path, "news", news)], PAIR, cfg())
    valid = pairs_of(without.parts["valid"])
    # the dictionary holds a valid source with another translation: it never trains
    words = numbered("word", 30) + [(valid[0][0], "另一个")]
    mixed = mix([corpus(tmp_path, "news", news),
                 corpus(tmp_path, "words", words, train_only=True)], PAIR, cfg())
    assert pairs_of(mixed.parts["valid"]) == valid
    assert pairs_of(mixed.parts["test"]) == pairs_of(without.parts["test"])
    got = mixed.counts["words"]
    assert (got["valid"], got["test"], got["train"], got["dropped_in_test_set"]) == (0, 0, 30, 1)
    assert (valid[0][0], "另一个") not in pairs_of(mixed.parts["train"])


def test_only_train_only_corpora_is_one_line(tmp_path):
    words = corpus(tmp_path, "words", numbered("word", 30), train_only=True)
    with pytest.raises(PipelineError, match="^every corpus is train_only: valid and test need "
                                            "one that is not$"):
        mix([words], PAIR, cfg())
