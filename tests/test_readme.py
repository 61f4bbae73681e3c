"""The README renders and its commands exist.

Fences must pair up on lines of their own (a stray "``` text" once swallowed half the page), the
page must not send users to paths of our machines, the two opening commands must be what CI
runs, and every `python -m src.<module>` or `python -m bench.<tool>` it shows must answer
`--help` at once (without importing torch, onnx, datasets or MLflow's model flavour).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^\s*```")


def code_blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_fences_pair_up_and_stand_alone():
    fences = [line for line in README.splitlines() if FENCE.match(line)]
    assert len(fences) % 2 == 0, "unbalanced ``` fences"
    for line in fences:
        assert re.fullmatch(r"\s*```[\w-]*", line), f"text after a fence: {line!r}"


def test_no_paths_of_our_machines():
    assert "../shared" not in README and "/work/" not in README


def test_opens_with_the_main_command_and_the_test_command():
    first, second = code_blocks(README)[:2]
    assert "dvc repro" in first and "pip install" in first
    assert "pytest" in second and "pip install" in second
    # CI runs exactly the command a user is told to run.
    ci_lines = (REPO / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert second.strip() in ci_lines


# The user guide's pages beyond the README (moved out of it to keep it short)
GUIDE = README + "".join((REPO / "docs" / page).read_text(encoding="utf-8")
                         for page in ("serving.md", "scaling.md", "experiments.md"))


def commands_shown() -> list[list[str]]:
    """Every module or tool the README and its guide pages tell a user to run, in code
    blocks or inline."""
    found = set(re.findall(r"python -m ((?:src|bench)\.\w+)", GUIDE))
    return [["-m", c] for c in sorted(found)]


def test_readme_shows_the_stage_commands():
    shown = {" ".join(c) for c in commands_shown()}
    stages = {"download", "split", "tokenize_corpus", "train", "evaluate", "export", "infer"}
    assert {f"-m src.{s}" for s in stages} <= shown, shown


# Libraries of seconds each to import: a command loads them when it runs, not to say what it does.
HEAVY = ("torch", "onnx", "mlflow.pyfunc", "datasets")


@pytest.mark.parametrize("command", commands_shown(), ids=" ".join)
def test_every_command_shown_answers_help_at_once(command):
    from helpers import run_module_imports

    result, imported = run_module_imports(command[1], ["--help"], HEAVY)
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower(), result.stdout
    assert not imported, f"{command[1]} --help imports {imported}"


@pytest.mark.parametrize("page", ["README.md", "docs/data.md"])
def test_the_data_example_is_params_the_loader_accepts(tmp_path, page):
    """The corpora and test sets a user copies from the page load as they are."""
    import yaml
    from helpers import scratch_root

    from src.core.params import DownloadParams, load_params

    text = (REPO / page).read_text(encoding="utf-8")
    block = next(b for b in code_blocks(text) if "corpora:" in b)
    example = yaml.safe_load(block)["download"]
    cfg = load_params(DownloadParams, scratch_root(tmp_path, download=example) / "params.yaml")
    assert len(cfg.corpora) == 2 and {"opus", "tatoeba"} & {c.name for c in cfg.corpora}
    assert {t.name for t in cfg.test_sets} >= {"wmt20", "flores"}
    assert cfg.corpus_list()[0].hub.id == "Helsinki-NLP/opus-100"
