"""The small tools of scripts/ that docs name for a number: mutation_test.py (docs/testing.md)
and halves.py (docs/results.md), on hand-made inputs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from helpers import load_script

REPO = Path(__file__).resolve().parent.parent


def test_mutation_copy_renames_our_package_and_nothing_else():
    mutation = load_script("mutation_test")
    text = "from src.core import paths\nimport src.train\nresrc.x = 'src/data/hub.py'\n"
    assert mutation.OURS.sub(mutation.RENAMED, text) == (
        "from nmtsrc.core import paths\nimport nmtsrc.train\nresrc.x = 'nmtsrc/data/hub.py'\n")


def test_mutation_scores_count_each_modules_mutants_by_outcome(tmp_path):
    """mutmut's exit codes per mutant, read back per module under our package's own name."""
    mutation = load_script("mutation_test")
    folder = tmp_path / "mutants" / "nmtsrc" / "data"
    folder.mkdir(parents=True)
    # mutmut: 1 = killed (the tests failed), 0 = survived, 24 = timeout
    (folder / "hub.py.meta").write_text(json.dumps(
        {"exit_code_by_key": {"a": 1, "b": 1, "c": 0, "d": 24}}))
    (folder / "mixing.py.meta").write_text(json.dumps({"exit_code_by_key": {}}))
    assert mutation.scores(tmp_path) == {
        "src/data/hub.py": Counter({"killed": 2, "survived": 1, "timeout": 1})}


def test_halves_split_the_training_pairs_by_whether_the_parent_saw_their_source(tmp_path):
    from datasets import Dataset, DatasetDict

    halves = load_script("halves")
    old = [("a", "1"), ("b", "2"), ("c", "3")]
    # the full run's pairs: the old ones, one more translation of an old source, two new
    full = old + [("a", "1b"), ("d", "4"), ("e", "5")]
    for name, pairs in (("old", old), ("full", full)):
        DatasetDict({"train": Dataset.from_dict({"source": [s for s, _ in pairs],
                                                 "target": [t for _, t in pairs]})}
                    ).save_to_disk(str(tmp_path / name))
    found = halves.halves(tmp_path / "old", tmp_path / "full", sample=10, seed=0)
    assert sorted(found["old"]) == old
    assert sorted(found["new"]) == [("d", "4"), ("e", "5")]  # ("a", "1b"): its source is old
    one = halves.halves(tmp_path / "old", tmp_path / "full", sample=2, seed=3)
    assert len(one["old"]) == 2 and one == halves.halves(tmp_path / "old", tmp_path / "full",
                                                         sample=2, seed=3)
