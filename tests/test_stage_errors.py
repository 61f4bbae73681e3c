"""Bad input at stage level: one `error:` line, exit 1, and no half-written output."""

from __future__ import annotations

import os

import pytest
from helpers import (
    REPO,
    assert_one_line_error,
    run_stage,
    run_stage_watching,
    scratch_root,
    stage_module,
)


def test_corpus_with_no_valid_line(tmp_path):
    root = scratch_root(tmp_path)
    corpus = root / "data/raw/corpus.tsv"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("just words\n\n\t\n", encoding="utf-8")
    assert_one_line_error(run_stage(root, "split"), "no valid")
    assert not (root / "data/split").exists()


@pytest.mark.parametrize(
    "stage, missing",
    [
        ("split", "data/raw/corpus.tsv"),
        ("tokenize", "data/split"),
        ("train", "data/tokenized"),
        ("evaluate", "models/model.pt"),
        ("export", "models/model.pt"),
    ],
)
def test_missing_upstream_output_is_said_before_the_heavy_imports(tmp_path, stage, missing):
    """At once: torch, datasets and MLflow each take a second or more to import."""
    result, imported = run_stage_watching(scratch_root(tmp_path), stage,
                                          ("torch", "datasets", "mlflow"))
    assert_one_line_error(result, missing)
    assert imported == []


def test_corrupt_model_for_evaluate(tmp_path):
    root = scratch_root(tmp_path)
    (root / "models/tokenizer").mkdir(parents=True)
    (root / "data/tokenized").mkdir(parents=True)
    (root / "models/model.pt").write_bytes(b"PK\x03\x04 not really a checkpoint")
    assert_one_line_error(run_stage(root, "evaluate"), "corrupt checkpoint")


def test_help_names_the_params_each_stage_reads():
    """Each stage's --help names every params.yaml section its dvc.yaml entry declares, so a
    user knows which keys change what it does."""
    import importlib

    import yaml
    from typer.testing import CliRunner

    # In this process, as Typer renders it (test_readme runs each README command's --help
    # in its own process, as a user does)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for stage in ("download", "split", "tokenize", "train", "evaluate", "export"):
        app = importlib.import_module(stage_module(stage)).app
        result = CliRunner().invoke(app, ["--help"], prog_name=stage)
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        for section in {key.split(".")[0] for key in stages[stage].get("params", [])}:
            assert f"{section}." in text, (stage, section, text)


def write_corpus(root, data: bytes, test: bytes | None = None):
    """data/raw as download writes it: test.tsv only for a predefined test set."""
    raw = root / "data/raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "corpus.tsv").write_bytes(data)
    if test is not None:
        (raw / "test.tsv").write_bytes(test)


def corpus_lines(n: int = 40) -> str:
    return "".join(f"Sentence number {i}.\t第{i}句。\n" for i in range(n))


def split_rows(root, part: str) -> list[tuple[str, str]]:
    from datasets import load_from_disk

    data = load_from_disk(str(root / "data/split"))[part]
    return list(zip(data["source"], data["target"]))


def test_gbk_corpus_is_refused_with_line_and_offset(tmp_path):
    root = scratch_root(tmp_path, split={"valid_size": 2, "test_size": 2})
    good = corpus_lines(5).encode("utf-8")
    write_corpus(root, good + "Tea.\t茶。\n".encode("gbk"))
    assert_one_line_error(run_stage(root, "split"),
                          f"not UTF-8 text at line 6, byte offset {len(good) + 5:,}")
    assert not (root / "data/split").exists()


def test_invalid_bytes_after_the_first_64_kib_are_refused(tmp_path):
    root = scratch_root(tmp_path, split={"valid_size": 2, "test_size": 2})
    write_corpus(root, corpus_lines(4000).encode("utf-8") + b"Bad.\t\xff\xfe\n")
    assert_one_line_error(run_stage(root, "split"), "not UTF-8 text at line 4001")


def test_lone_carriage_return_or_u2028_inside_a_field_does_not_shift_pairs(tmp_path):
    root = scratch_root(tmp_path, split={"valid_size": 1, "test_size": 1})
    text = corpus_lines(6) + "Two\rlines.\t两\r行。\n" + "Para\u2028graph.\t段\u2028落。\n"
    write_corpus(root, text.encode("utf-8"))
    result = run_stage(root, "split")
    assert result.returncode == 0, result.stderr
    rows = {s: t for part in ("train", "valid", "test") for s, t in split_rows(root, part)}
    assert len(rows) == 8
    assert rows["Two lines."] == "两 行。"  # a lone CR is whitespace, not a line break
    assert rows["Para graph."] == "段 落。"
    assert rows["Sentence number 5."] == "第5句。"


def test_predefined_test_set_losing_rows_is_counted_and_warned(tmp_path):
    import json

    root = scratch_root(tmp_path, split={"valid_size": 2, "test_size": 2})
    test = "Hello.\t你好。\n\tno source\nno tab at all\nBye.\t再见。\n"
    write_corpus(root, corpus_lines(20).encode("utf-8"), test.encode("utf-8"))
    result = run_stage(root, "split")
    assert result.returncode == 0, result.stderr
    assert "lost 2 of 4 rows" in result.stderr
    counts = json.loads((root / "data/split_stats.json").read_text())
    assert counts["test_dropped_empty"] == 1 and counts["test_dropped_malformed"] == 1
    assert len(split_rows(root, "test")) == 2


@pytest.mark.parametrize(
    "stage, args, fragment, code",
    [
        ("split", ["--bogus"], "No such option: --bogus", 2),
        ("download", ["extra-arg"], "unexpected extra argument", 2),
        ("infer", ["--beam", "0", "hi"], "'--beam'", 2),
        ("infer", ["--beam", "129", "hi"], "'--beam'", 2),  # ORT's BeamSearch stops at 128
        ("infer", ["--threads", "many", "hi"], "'--threads'", 2),
        ("train", ["--checkpoint-every-steps", "0"], "'--checkpoint-every-steps'", 2),
    ],
)
def test_usage_errors_are_one_line_naming_the_option(tmp_path, stage, args, fragment, code):
    result = run_stage(scratch_root(tmp_path), stage, *args)
    assert_one_line_error(result, fragment, code=code)


def test_unexpected_exception_is_one_line_with_the_traceback_saved(monkeypatch, capsys):
    """A bug is still one line for the user; the traceback goes to a file the line names."""
    import re

    import typer

    from src.core.cli import run_cli

    app = typer.Typer(add_completion=False)

    @app.command()
    def main() -> None:
        {}["missing"]  # a bug: KeyError

    monkeypatch.setattr("sys.argv", ["prog"])
    monkeypatch.delenv("NMT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(app)
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: unexpected KeyError") and "Traceback" not in err
    saved = re.search(r"traceback saved to (\S+),", err).group(1)
    assert "KeyError" in open(saved).read()
    os.unlink(saved)


def test_disk_full_is_one_line_not_a_traceback(monkeypatch, capsys):
    import errno

    import typer

    from src.core.cli import run_cli

    app = typer.Typer(add_completion=False)

    @app.command()
    def main() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "data/raw/corpus.tsv")

    monkeypatch.setattr("sys.argv", ["prog"])
    with pytest.raises(SystemExit):
        run_cli(app)
    assert capsys.readouterr().err == "error: No space left on device: data/raw/corpus.tsv\n"


def test_vocabulary_too_small_for_the_corpus_names_the_param(tmp_path):
    """cmn-eng at vocab_size 2000 failed with SentencePiece's raw `INTERNAL: …` line."""
    root = scratch_root(tmp_path, split={"valid_size": 2, "test_size": 2},
                        tokenize={"vocab_size": 40, "byte_fallback": False})
    chars = [chr(0x4E00 + i) for i in range(200)]
    text = "".join(f"Line {i}.\t{chars[i % 200]}{chars[(7 * i) % 200]}。\n" for i in range(400))
    write_corpus(root, text.encode("utf-8"))
    assert run_stage(root, "split").returncode == 0
    result = run_stage(root, "tokenize")
    assert_one_line_error(result, "tokenize.vocab_size=40 is too small for this corpus")
    assert "INTERNAL" not in result.stderr


@pytest.mark.slow  # tokenizes a project
def test_bidirectional_training_without_a_shared_vocabulary_names_the_params(tmp_path):
    from helpers import TINY_PARAMS, tokenize_toy

    separate = {**TINY_PARAMS["tokenize"], "shared_vocab": False}
    root = tokenize_toy(tmp_path, **{**TINY_PARAMS, "tokenize": separate,
                                     "train": {"bidirectional_epochs": 1}})
    result = run_stage(root, "train")
    assert_one_line_error(result, "train.bidirectional_epochs needs one vocabulary for both sides")


@pytest.fixture
def stop_handlers():
    """SIGINT and SIGTERM handled as run_cli handles them, restored afterwards."""
    import signal

    from src.core import cli

    previous = {signum: signal.signal(signum, cli._stop) for signum in cli.STOPS}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    cli._stopped_by.clear()


def test_a_stop_while_the_runs_are_closed_waits_until_both_are_ended(stop_handlers):
    """A SIGTERM that landed between ending the stage's MLflow run and ending its repro run
    left the repro run RUNNING forever (seen in CI); now both end, then the stop acts."""
    import signal

    from src.core import cli, tracking

    ended = []

    class Mlflow:
        @staticmethod
        def end_run(status):
            ended.append(("stage", status))
            os.kill(os.getpid(), signal.SIGTERM)  # delivered before the next bytecode

    class Client:
        @staticmethod
        def set_terminated(run_id, status):
            ended.append((run_id, status))

    with pytest.raises(cli.Terminated):
        tracking._finish(Mlflow, Client, "repro", "FINISHED")
    assert ended == [("stage", "FINISHED"), ("repro", "FINISHED")]


def test_a_second_stop_inside_a_deferred_block_acts_at_once(stop_handlers):
    """So a tracking server that hangs while runs are closed cannot make Ctrl-C wait."""
    import signal

    from src.core import cli

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with cli.stops_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the first")
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the second")
    assert reached == ["after the first"]


def test_a_stop_inside_an_mlflow_call_acts_once_the_call_is_done(stop_handlers, monkeypatch,
                                                                   capsys):
    """Cut inside a write, MLflow's SQL store kept its SQLite write lock: ending the runs then
    failed "database is locked" and left both RUNNING (seen at random in CI)."""
    import signal

    import mlflow

    from src.core import cli, tracking

    logged = []

    def log_metrics(metrics, step=None):
        os.kill(os.getpid(), signal.SIGTERM)
        logged.append(metrics)  # the rest of the write, which the stop used to cut off

    monkeypatch.setattr(mlflow, "log_metrics", log_metrics)
    with pytest.raises(cli.Terminated):
        tracking.MlflowRun(None, "run").log_metrics({"loss": 1.0}, step=1)
    assert logged == [{"loss": 1.0}]
    assert "stopping once MLflow's log_metrics is done" in capsys.readouterr().err


def test_a_deferred_stop_outside_the_cli_still_ends_the_process():
    """Code that uses the tracking helpers without run_cli (SIGTERM at its default action)
    must still die of a SIGTERM held during an MLflow call, not carry on as if none came."""
    import signal

    from helpers import python_snippet

    code = ("import os, signal\nfrom src.core import cli\nwith cli.stops_deferred():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n    print('held', flush=True)\n"
            "print('went on')\n")
    result = python_snippet(code, timeout=60)
    assert result.returncode == -signal.SIGTERM and result.stdout == "held\n", result


def test_every_command_exits_without_the_last_garbage_collection():
    """CPython's last pass of the garbage collector over every object took about a second of
    each command's exit (torch, MLflow and datasets loaded): src.core.cli freezes what is left
    once the exit hooks registered after it (MLflow's) are done, so that pass skips it."""
    from helpers import python_snippet

    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen after:', gc.get_freeze_count() > 0))\n"
            "from src.core import cli\n"
            "atexit.register(lambda: print('frozen before:', gc.get_freeze_count() > 0))\n")
    result = python_snippet(code)
    assert result.returncode == 0, result.stderr
    # exit hooks run last registered first: the later hook (MLflow's place) sees nothing frozen
    assert result.stdout.splitlines() == ["frozen before: False", "frozen after: True"]
