"""`python -m src.infer` on the exported toy project: text, stdin, files, the int8 file, bad input
in one line, n-best lists as TSV and JSON Lines, never importing torch, and refusing a file of
an older format."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from helpers import REPO, assert_one_line_error, python_snippet, run_stage
from onnx_checks import infer
from toy_corpus import toy_pairs
from toy_projects import write_tokenizer

from src.data.subword import train_spm
from src.runtime import contract

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


def help_defaults(module: str) -> dict[str, str]:
    """`--option: default` as `python -m <module> --help` prints them, on a wide terminal."""
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, text=True,
                            capture_output=True, env={**os.environ, "COLUMNS": "400"}, check=True)
    return dict(re.findall(r"(--[a-z-]+)\b.*?\[default: ([^\]]+)\]", result.stdout))


def test_infer_translates_a_sentence_argument(project):
    result = infer(project, "I have three cats.", "--beam", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and result.stdout.strip()
    assert "CPUExecutionProvider" in result.stderr  # says which provider ran


def test_infer_stdin_keeps_empty_lines_and_warns_on_long_ones(project):
    long_line = " ".join(["She likes three dogs."] * 30)  # far past 48 tokens
    text = "I have three cats.\n\nWe see two birds.\n" + long_line + "\n"
    result = infer(project, stdin=text)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 5 and lines[4] == ""  # 4 lines in, 4 out (+ final newline)
    assert lines[0] and lines[1] == "" and lines[2] and lines[3]
    assert "warning: line 4" in result.stderr and "truncated" in result.stderr
    assert "Traceback" not in result.stderr


def test_infer_file_in_batches_equals_line_by_line(project, tmp_path):
    source = tmp_path / "en.txt"
    source.write_text("He sees one bird.\nThey like ten horses.\n\nYou have four fish.\n")
    out = tmp_path / "zh.txt"
    result = infer(project, "--input", str(source), "--output", str(out), "--batch-size", "2")
    assert result.returncode == 0, result.stderr
    batched = out.read_text().split("\n")
    assert len(batched) == 5 and batched[2] == ""
    one_by_one = infer(project, stdin=source.read_text()).stdout.split("\n")
    assert batched == one_by_one


def test_infer_errors_are_one_line(project, tmp_path):
    assert_one_line_error(infer(project, "hi", model=tmp_path / "missing.onnx"),
                          "model not found")
    corrupt = tmp_path / "corrupt" / "model.onnx"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\x08\x07 this is not a protobuf" * 10)
    shutil.copytree(project / "models/tokenizer", corrupt.parent / "tokenizer")
    assert_one_line_error(infer(project, "hi", model=corrupt), "cannot load model")
    assert_one_line_error(infer(project, "hi", "--provider", "tpu"), "--provider")


def test_infer_invalid_utf8_on_stdin_is_one_line_naming_the_line(project):
    result = run_stage(project, "infer", "--onnx", str(project / "models/model.onnx"),
                       stdin_bytes=b"one cat\ntwo dogs\n\xc3\x28 broken\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == result.stderr.strip().splitlines()[-1:]  # one error line, at the end
    assert "<stdin>: not UTF-8 text at line 3" in errors[0]
    assert len(result.stdout.splitlines()) == 2  # the lines before it were translated


def test_infer_output_file_is_readable_like_any_file(project, tmp_path):
    import os

    source = tmp_path / "in.txt"
    source.write_text("one cat\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    result = infer(project, "--input", str(source), "--output", str(out))
    assert result.returncode == 0, result.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_infer_refuses_a_tokenizer_that_does_not_match(project, tmp_path):
    other = train_spm([e for e, _ in toy_pairs()], vocab_size=60, model_type="unigram",
                      character_coverage=1.0, byte_fallback=False, seed=0)
    write_tokenizer(tmp_path / "tok", other)
    result = infer(project, "hi", "--tokenizer", str(tmp_path / "tok"))
    assert_one_line_error(result, "does not match the model")
    lonely = tmp_path / "alone" / "model.onnx"
    lonely.parent.mkdir()
    shutil.copy(project / "models/model.onnx", lonely)
    assert_one_line_error(infer(project, "hi", model=lonely), "tokenizer not found")


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present")
def test_infer_cuda_without_gpu_is_a_clear_error(project):
    assert_one_line_error(infer(project, "hi", "--provider", "cuda"), "not available")


def test_infer_imports_neither_torch_nor_training_code():
    code = ("import sys, src.infer; heavy = {'torch', 'onnx', 'datasets', 'src.nmt.model', "
            "'src.nmt.search', 'src.graph.onnx_graph'} & set(sys.modules); print(sorted(heavy))")
    result = python_snippet(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx", "model.text.onnx",
                                  "model.int8.text.onnx"])
def test_translating_with_any_file_never_imports_torch(project, name):
    """torch is installed here: opening and running a file must still not import it. The text
    files' operator library came from importing onnxruntime_extensions, whose package imports
    torch (2 s, 250 MB), and it was loaded for every file, text or not."""
    code = ("import sys; from pathlib import Path; from src.runtime import generation; "
            "t = generation.load_translator(Path(sys.argv[1])); "
            "print(t.translate(['She sees five rabbits.'])); "
            "print(sorted({'torch', 'onnxruntime_extensions'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code, str(project / "models" / name)],
                            cwd=REPO, capture_output=True, text=True, check=True)
    translations, loaded = result.stdout.strip().splitlines()[-2:]
    assert translations.startswith("['") and loaded == "[]"
    cli = ("import sys, runpy; sys.argv = ['infer', '--onnx', sys.argv[1], 'Hi.']; "
           "import atexit; atexit.register(lambda: print(sorted({'torch'} & set(sys.modules)), "
           "file=sys.stderr)); runpy.run_module('src.infer', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", cli, str(project / "models" / name)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "[]"


def test_int8_model_runs_through_infer(project):
    result = infer(project, "She sees five rabbits.", model=project / "models/model.int8.onnx")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    # where its nodes run, and the thread count --help promises unless --threads says otherwise
    # (the help said an int8 model ran on one thread while it ran on two)
    promised = help_defaults("src.infer")["--threads"]
    said = "1 thread" if promised == "1" else f"{promised} threads"  # one CPU to run on: one
    assert re.search(rf"^infer: CPUExecutionProvider \d+ nodes, {said}$", result.stderr, re.M)
    forced = infer(project, "Hi.", "--threads", "1", model=project / "models/model.int8.onnx")
    assert re.search(r"^infer: CPUExecutionProvider \d+ nodes, 1 thread$", forced.stderr, re.M)


@pytest.mark.parametrize("name", ["model.onnx", "model.text.onnx"])
def test_a_file_of_the_retired_format_is_refused_in_one_line(project, tmp_path, name):
    """A file written before this version's contract (metadata `format` nmt-beamsearch-1 or
    nmt-text-1) is refused by infer, the site and the text twin, saying to export again."""
    model = onnx.load(str(project / "models" / name))
    retired = dict(zip(["model.onnx", "model.text.onnx"], contract.RETIRED_FORMATS))[name]
    next(p for p in model.metadata_props if p.key == "format").value = retired
    old = tmp_path / name
    onnx.save(model, old)
    shutil.copytree(project / "models/tokenizer", tmp_path / "tokenizer")
    assert_one_line_error(infer(project, "Hello.", model=old),
                          f"was written by an older version of the export (format {retired}; "
                          f"this version reads {contract.GRAPH_FORMAT} and "
                          f"{contract.TEXT_FORMAT}): export it again with python -m src.export")
    if name == "model.onnx":
        from src.core.errors import PipelineError
        from src.graph.text_twin import wrap

        with pytest.raises(PipelineError, match="older version of the export"):
            wrap(model, b"", b"")


def test_infer_writes_a_text_twins_n_best_list(project):
    lines = "I have three cats.\n\nWhere is the station?\n"
    runs = [infer(project, "--n-best", "2", "--format", "jsonl", stdin=lines,
                  model=project / "models" / name) for name in ("model.text.onnx", "model.onnx")]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    from_text, from_ids = ([json.loads(line) for line in run.stdout.splitlines()]
                           for run in runs)
    assert [[h["text"] for h in r["hypotheses"]] for r in from_text] == [
        [h["text"] for h in r["hypotheses"]] for r in from_ids]
    assert len(from_text[0]["hypotheses"]) == 2 and from_text[1]["hypotheses"] == []
    assert from_text[0]["confidence"] == pytest.approx(from_ids[0]["confidence"], abs=1e-5)
    assert_one_line_error(infer(project, "--n-best", "4", "Hello.",
                                model=project / "models/model.text.onnx"),
                          "n-best 4: a search with beam 3 returns 1 to 3")


def test_infer_writes_n_best_lists_as_json_lines_and_tsv(project):
    lines = "I have three cats.\n\nWhere is the station?\n"
    plain = infer(project, "--beam", "3", stdin=lines).stdout.splitlines()
    result = infer(project, "--beam", "3", "--n-best", "2", "--format", "jsonl", stdin=lines)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert [r["source"] for r in records] == lines.splitlines()
    assert records[1]["hypotheses"] == [] and records[1]["confidence"] is None
    for record, text in zip((records[0], records[2]), (plain[0], plain[2])):
        first, second = record["hypotheses"]
        assert first["text"] == text and first["score"] >= second["score"]
        assert first["tokens"] >= 1 and 0.0 <= record["confidence"] <= 1.0
    tsv = infer(project, "--beam", "3", "--scores", stdin=lines)
    assert tsv.returncode == 0, tsv.stderr
    rows = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [("1", "1"), ("3", "1")]
    assert [r[4] for r in rows] == [plain[0], plain[2]]
    assert float(rows[0][2]) == pytest.approx(records[0]["hypotheses"][0]["score"], abs=1e-5)
    assert float(rows[0][3]) == pytest.approx(records[0]["confidence"], abs=1e-5)


@pytest.mark.parametrize("args, fragment", [
    (["--n-best", "4", "--beam", "3"], "n-best 4: a search with beam 3 returns 1 to 3"),
    (["--format", "xml"], "--format must be one of text, tsv, jsonl, not 'xml'"),
    (["--format", "text", "--scores"], "--format text writes translations only"),
])
def test_infer_refuses_impossible_output_requests(project, args, fragment):
    assert_one_line_error(infer(project, *args, "Hello."), fragment)


def test_infer_n_best_zero_is_a_usage_error(project):
    result = infer(project, "--n-best", "0", "Hello.")
    assert result.returncode == 2 and "--n-best" in result.stderr
