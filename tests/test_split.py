"""Cleaning and the grouped split: counts, determinism, and no source sentence in two splits."""

from __future__ import annotations

import pytest

from src.core.errors import PipelineError
from src.core.params import PairParams, SplitParams
from src.data.splitting import read_pairs, split_grouped

PAIR = PairParams(source_lang="en", target_lang="zh", source_column=0, target_column=1)


def cfg(**kw) -> SplitParams:
    base = dict(seed=0, valid_size=2, test_size=2, max_chars=20)
    return SplitParams(**{**base, **kw})


def test_read_pairs_drops_and_counts():
    lines = [
        "Hi.\t嗨。\tattribution\n",
        "Hi.\t嗨。\tattribution\n",  # exact duplicate
        "Hi.\t你好。\tattribution\n",  # second translation: kept
        "\n",  # empty
        "no tab here\n",  # malformed
        " \t 好 \tx\n",  # empty source after cleaning
        "x" * 21 + "\t长\tx\n",  # over-long source
        "\ufeffRun!\t  跑！ \tx\r\n",  # BOM, padding and CRLF are cleaned
    ]
    out = read_pairs(lines, PAIR, max_chars=20)
    assert out.pairs == [("Hi.", "嗨。"), ("Hi.", "你好。"), ("Run!", "跑！")]
    assert out.dropped == {"duplicate": 1, "empty": 2, "malformed": 1, "too_long": 1}


def test_read_pairs_honours_column_order():
    zh_en = PairParams(source_lang="zh", target_lang="en", source_column=1, target_column=0)
    assert read_pairs(["Hi.\t嗨。\tx\n"], zh_en, 20).pairs == [("嗨。", "Hi.")]


def test_read_pairs_counts_every_drop_and_keeps_the_limits():
    """Each reason counted as often as it happens; exactly max_chars is kept on either side; a
    line with just the needed columns is not malformed; inner whitespace becomes one space."""
    lines = ["a\tb", "a\tb", "a\tb",             # two duplicates
             "x" * 20 + "\t" + "y" * 20,          # exactly max_chars: kept
             "x" * 21 + "\ty", "x\t" + "y" * 21,  # one side too long, each side
             "one column", "still one",            # malformed twice
             "", "  ", " \t ",                     # empty three times
             "two  words\t here \u3000 now \tx"]
    out = read_pairs(lines, PAIR, max_chars=20)
    assert out.pairs == [("a", "b"), ("x" * 20, "y" * 20), ("two words", "here now")]
    assert out.dropped == {"duplicate": 2, "too_long": 2, "malformed": 2, "empty": 3}


def test_sizes_under_one_are_fractions_and_from_one_counts():
    from src.data.splitting import group_count

    assert group_count(0.1, 50) == 5
    assert group_count(1, 50) == 1 and group_count(1.5, 50) == 1 and group_count(7, 50) == 7


def test_the_parts_are_written_as_one_dataset_of_source_target_columns(tmp_path):
    from datasets import load_from_disk

    from src.data.splitting import write_parts

    parts = {"train": [("a", "b"), ("c", "d")], "valid": [("e", "f")], "test": [("g", "h")]}
    write_parts(parts, tmp_path / "split")
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
