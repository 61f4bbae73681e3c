"""`python -m src.to_ctranslate2` on the exported toy project: the same weights translate the
same in CTranslate2, from any working directory, with one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from src.runtime import contract, generation

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed (a test
    that writes into a project copies it)."""
    return exported_toy


# -- the same weights in CTranslate2 (src/to_ctranslate2.py) --------------------------------------
@pytest.mark.parametrize("beam", [1, 3])
def test_ctranslate2_conversion_translates_as_our_model(project, tmp_path, beam):
    """Converted weights + ct2_options: CTranslate2 gives our exact translations."""
    import ctranslate2
    import sentencepiece as spm
    from datasets import load_from_disk

    from src.to_ctranslate2 import convert, ct2_options, pieces

    models = project / "models"
    ct2_dir = convert(models / "model.pt", models / "tokenizer", tmp_path / "ct2")
    sp = spm.SentencePieceProcessor(model_file=str(models / "tokenizer/target.model"))
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=1)
    ours = generation.load_translator(models / "model.onnx", threads=1)
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:40]
    want = ours.translate(sources, beam, batch_size=1)
    got = []
    for line in sources:
        tokens = sp.encode(line, out_type=str) + ["</s>"]
        new = contract.max_new_tokens(len(tokens), float(ours.meta["max_length_ratio"]),
                                      int(ours.meta["max_output_tokens"]))
        result = translator.translate_batch([tokens], **ct2_options(
            pieces(sp), beam, new, float(ours.meta["length_penalty"])))
        got.append(sp.decode(result[0].hypotheses[0]))
    assert got == want and any(want)


def test_ctranslate2_cli_finds_the_project_whatever_the_working_directory(project, tmp_path):
    """Its defaults are the project's models/ (src.core.paths), like every stage's; they used
    to be relative to the working directory."""
    project = Path(shutil.copytree(project, tmp_path / "project"))  # it writes models/ct2
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "NMT_ROOT": str(project), "NMT_TRACKING": "off"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "src.to_ctranslate2"], cwd=elsewhere,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (project / "models/ct2/model.bin").is_file() and not (elsewhere / "models").exists()


def test_ctranslate2_missing_is_one_instruction(project, tmp_path, monkeypatch):
    from src.core.errors import PipelineError
    from src.to_ctranslate2 import convert

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    models = project / "models"
    with pytest.raises(PipelineError, match=r"ctranslate2 is not installed: pip install -e "
                                            r"'\.\[ctranslate2\]'"):
        convert(models / "model.pt", models / "tokenizer", tmp_path / "ct2")


def test_a_failed_ctranslate2_conversion_keeps_the_old_directory(project, tmp_path,
                                                                 monkeypatch):
    from src import to_ctranslate2

    old = tmp_path / "ct2"
    old.mkdir()
    (old / "model.bin").write_bytes(b"the previous conversion")
    real_build = to_ctranslate2.build_spec

    def build_then_fail_on_save(*args):
        spec = real_build(*args)

        def save(directory):
            (Path(directory) / "model.bin").write_bytes(b"half")
            raise OSError(28, "No space left on device")

        spec.save = save
        return spec

    monkeypatch.setattr(to_ctranslate2, "build_spec", build_then_fail_on_save)
    models = project / "models"
    with pytest.raises(OSError, match="No space left"):
        to_ctranslate2.convert(models / "model.pt", models / "tokenizer", old)
    assert (old / "model.bin").read_bytes() == b"the previous conversion"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no half-written sibling
