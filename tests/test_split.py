"""Cleaning and the grouped split: counts, determinism, and no source sentence in two splits."""

from __future__ import annotations

import pytest

from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams
from src.data.mixing import CorpusFile, read_corpora
from src.data.splitting import read_pairs, split_grouped

PAIR = PairParams(source_lang="en", target_lang="zh", source_column=0, target_column=1)


def cfg(**kw) -> SplitParams:
    base = dict(seed=0, valid_size=2, test_size=2, max_chars=20)
    return SplitParams(**{**base, **kw})


def corpus_file(tmp_path, name: str, lines: list[str]) -> CorpusFile:
    path = tmp_path / f"{name}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return CorpusFile(name, path, 1.0)


def read_one(tmp_path, lines: list[str], max_chars: int = 20):
    table, counts = read_corpora([corpus_file(tmp_path, "c", lines)], PAIR, max_chars)
    pairs = list(zip(table["source"].to_pylist(), table["target"].to_pylist()))
    return pairs, {k.removeprefix("dropped_"): v for k, v in counts["c"].items()
                   if k.startswith("dropped_") and v}


def test_a_corpus_is_cleaned_and_each_drop_counted(tmp_path):
    lines = [
        "Hi.\t嗨。\tattribution",
        "Hi.\t嗨。\tattribution",  # exact duplicate
        "Hi.\t你好。\tattribution",  # second translation: kept
        "",  # empty
        "no tab here",  # malformed
        " \t 好 \tx",  # empty source after cleaning
        "x" * 21 + "\t长\tx",  # over-long source
        "\ufeffRun!\t  跑！ \tx\r",  # BOM, padding and CRLF are cleaned
    ]
    pairs, dropped = read_one(tmp_path, lines)
    assert pairs == [("Hi.", "嗨。"), ("Hi.", "你好。"), ("Run!", "跑！")]
    assert dropped == {"duplicate": 1, "empty": 2, "malformed": 1, "too_long": 1}


def test_read_pairs_honours_column_order():
    zh_en = PairParams(source_lang="zh", target_lang="en", source_column=1, target_column=0)
    assert read_pairs(["Hi.\t嗨。\tx\n"], zh_en, 20).pairs == [("嗨。", "Hi.")]


def test_a_test_set_keeps_its_duplicates():
    """A published test set is scored whole: read_pairs drops what cannot be scored only."""
    out = read_pairs(["a\tb", "a\tb", "no tab"], PAIR, 20)
    assert out.pairs == [("a", "b"), ("a", "b")] and out.dropped == {"malformed": 1}


def test_every_drop_is_counted_and_the_limits_kept(tmp_path):
    """Each reason counted as often as it happens; exactly max_chars is kept on either side; a
    line with just the needed columns is not malformed; inner whitespace becomes one space."""
    lines = ["a\tb", "a\tb", "a\tb",             # two duplicates
             "x" * 20 + "\t" + "y" * 20,          # exactly max_chars: kept
             "x" * 21 + "\ty", "x\t" + "y" * 21,  # one side too long, each side
             "one column", "still one",            # malformed twice
             "", "  ", " \t ",                     # empty three times
             "two  words\t here \u3000 now \tx"]
    pairs, dropped = read_one(tmp_path, lines)
    assert pairs == [("a", "b"), ("x" * 20, "y" * 20), ("two words", "here now")]
    assert dropped == {"duplicate": 2, "too_long": 2, "malformed": 2, "empty": 3}


def test_a_pair_an_earlier_corpus_has_is_its_duplicate_and_counts_stay_per_corpus(tmp_path):
    """Duplicates across Arrow batches and across corpora: the first line keeps the pair."""
    import src.data.mixing as mixing

    first = corpus_file(tmp_path, "first", ["a\tb", "c\td", "a\tb", "e\tf"])
    second = corpus_file(tmp_path, "second", ["c\td", "g\th", "bad", "g\th", "a\tz"])
    original = mixing.BATCH_PAIRS
    mixing.BATCH_PAIRS = 2
    try:
        table, counts = read_corpora([first, second], PAIR, 20)
    finally:
        mixing.BATCH_PAIRS = original
    assert list(zip(table["source"].to_pylist(), table["target"].to_pylist(),
                    table["corpus"].to_pylist())) == [
        ("a", "b", 0), ("c", "d", 0), ("e", "f", 0), ("g", "h", 1), ("a", "z", 1)]
    assert counts["first"] == {"read": 4, "dropped_empty": 0, "dropped_malformed": 0,
                               "dropped_too_long": 0, "dropped_duplicate": 1}
    assert counts["second"] == {"read": 5, "dropped_empty": 0, "dropped_malformed": 1,
                                "dropped_too_long": 0, "dropped_duplicate": 2}


def test_sizes_under_one_are_fractions_and_from_one_counts():
    from src.data.splitting import group_count

    assert group_count(0.1, 50) == 5
    assert group_count(1, 50) == 1 and group_count(1.5, 50) == 1 and group_count(7, 50) == 7


def test_the_parts_are_written_as_one_dataset_of_source_target_columns(tmp_path):
    from datasets import load_from_disk

    from src.data.splitting import pairs_table, write_parts

    parts = {"train": [("a", "b"), ("c", "d")], "valid": [("e", "f")], "test": [("g", "h")]}
    write_parts({name: pairs_table(rows) for name, rows in parts.items()}, tmp_path / "split")
    loaded = load_from_disk(str(tmp_path / "split"))
    assert {name: list(zip(loaded[name]["source"], loaded[name]["target"]))
            for name in loaded} == parts


def grouped_pairs():
    # 10 source sentences, some with several translations
    return [(f"s{i}", f"t{i}-{j}") for i in range(10) for j in range(1 + i % 3)]


def test_split_is_grouped_and_complete():
    pairs = grouped_pairs()
    parts = split_grouped(pairs, cfg())
    sources = {name: {s for s, _ in rows} for name, rows in parts.items()}
    assert len(sources["valid"]) == 2 and len(sources["test"]) == 2
    assert not sources["train"] & sources["valid"]
    assert not sources["train"] & sources["test"]
    assert not sources["valid"] & sources["test"]
    assert sorted(sum(parts.values(), [])) == sorted(pairs)  # nothing lost, nothing doubled


def test_split_is_reproducible_from_seed():
    pairs = grouped_pairs()
    first = split_grouped(pairs, cfg())
    assert split_grouped(pairs, cfg()) == first
    # membership depends on the seed only, not on the corpus line order
    reordered = split_grouped(list(reversed(pairs)), cfg())
    assert {k: sorted(v) for k, v in reordered.items()} == {k: sorted(v) for k, v in first.items()}
    other = split_grouped(pairs, cfg(seed=1))
    assert {s for s, _ in other["test"]} != {s for s, _ in first["test"]}


def test_split_fraction_sizes():
    parts = split_grouped(grouped_pairs(), cfg(valid_size=0.1, test_size=0.2))
    assert len({s for s, _ in parts["valid"]}) == 1
    assert len({s for s, _ in parts["test"]}) == 2


def test_split_refuses_to_leave_no_training_data():
    with pytest.raises(PipelineError, match="none of 10"):
        split_grouped(grouped_pairs(), cfg(valid_size=5, test_size=5))


def test_predefined_test_set_is_the_test_split_and_leaves_train():
    pairs = grouped_pairs()
    test = [("s3", "given-3"), ("new", "given-new")]
    parts = split_grouped(pairs, cfg(test_size=5), test)
    assert parts["test"] == test  # as given; test_size is unused
    assert len({s for s, _ in parts["valid"]}) == 2
    kept = {s for name in ("train", "valid") for s, _ in parts[name]}
    assert "s3" not in kept  # a test source never reaches train or valid
    assert kept == {f"s{i}" for i in range(10)} - {"s3"}


def test_a_train_fraction_keeps_a_seeded_share_of_training_sources_and_the_same_valid_test():
    """A parent trained on part of the data and its fine-tune on all of it are tested on the
    same sentences: train_fraction only thins the training sources."""
    pairs = [(f"s{i}", f"t{i}") for i in range(300)] + [(f"s{i}", f"u{i}") for i in range(50)]
    full = split_grouped(pairs, cfg(valid_size=30, test_size=40))
    half = split_grouped(pairs, cfg(valid_size=30, test_size=40, train_fraction=0.5))
    assert half["valid"] == full["valid"] and half["test"] == full["test"]
    sources = {s for s, _ in full["train"]}
    kept = {s for s, _ in half["train"]}
    assert kept < sources and len(kept) == round(0.5 * len(sources))
    assert half["train"] == [p for p in full["train"] if p[0] in kept]  # all of each kept group
    again = split_grouped(pairs, cfg(valid_size=30, test_size=40, train_fraction=0.5))
    assert again == half


def reference_split(pairs, cfg, test_sources=frozenset(), predefined_test=False):
    """The rule the split was first written as, on Python lists: the sorted distinct sources
    shuffled with random.Random(seed), valid first, then test, then a seeded train_fraction."""
    import random

    sources = sorted({s for s, _ in pairs if s not in test_sources})
    random.Random(cfg.seed).shuffle(sources)
    n_valid, n_test = int(cfg.valid_size), 0 if predefined_test else int(cfg.test_size)
    part_of = {s: "valid" for s in sources[:n_valid]}
    part_of.update({s: "test" for s in sources[n_valid:n_valid + n_test]})
    training = sources[n_valid + n_test:]
    random.Random(f"{cfg.seed}/train_fraction").shuffle(training)
    keep = max(1, int(round(cfg.train_fraction * len(training))))
    part_of.update({s: "unused" for s in training[keep:]})
    return {name: [p for p in pairs if p[0] not in test_sources
                   and part_of.get(p[0], "train") == name] for name in ("train", "valid", "test")}


@pytest.mark.parametrize("seed, train_fraction", [(0, 1.0), (7, 0.6)])
def test_the_parts_are_those_of_shuffling_the_sorted_sources(seed, train_fraction):
    """The Arrow split puts every sentence where the list rule puts it, so the default split
    (and every score published on it) stays the same; sources sort by code point, as Python
    sorts them, whatever their script."""
    import random

    rng = random.Random(1)
    words = ["Zoo", "apple", "été", "中文", "😀 smile", "\uffff", "Ölfass", "zebra", "Ápple"]
    pairs = [(f"{rng.choice(words)} {i % 37}", f"t{i}") for i in range(400)]
    config = cfg(seed=seed, valid_size=9, test_size=11, train_fraction=train_fraction)
    assert split_grouped(pairs, config) == reference_split(pairs, config)
    test = [(pairs[5][0], "given"), ("not in the corpus", "given")]
    config = cfg(seed=seed, valid_size=9, test_size=11, train_fraction=train_fraction)
    got = split_grouped(pairs, config, test)
    want = reference_split(pairs, config, frozenset(s for s, _ in test), predefined_test=True)
    assert got["train"] == want["train"] and got["valid"] == want["valid"]


def test_pairs_that_share_a_digest_are_compared_as_text():
    """A digest collision never drops a distinct pair: rows that share a digest are told apart
    by their text, and the first of each exact pair is kept."""
    import pyarrow as pa

    from src.data.mixing import first_occurrences

    table = pa.table({"source": ["a", "c", "a", "e", "c"], "target": ["b", "d", "b", "f", "d"],
                      "digest": pa.array([7, 7, 7, 9, 7], pa.int64())})
    assert first_occurrences(table).tolist() == [True, True, False, True, False]
