"""The registered MLflow model: text in, text out, equal to `src.infer`, loadable with
mlflow.pyfunc and served by `mlflow models serve`, refusing bad requests with a 4xx."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import REPO, clean_environ, run_stage
from toy_projects import exported_project

pytestmark = pytest.mark.slow
SENTENCES = ["I have two cats.", "She likes three dogs.", "They see one bird."]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    # as if evaluate had scored a named test set, and train had started from version 7
    return exported_project(tmp_path_factory.mktemp("serving"), tracking=True, files={
        "data/eval/metrics.json": json.dumps(EVALUATED),
        "models/parent/parent.json": json.dumps(PARENT)})


EVALUATED = {"bleu": 12.5, "chrf": 20.0, "test_sets": {"old": {"bleu": 30.0, "chrf": 40.0}}}
PARENT = {"init_from": "models:/nmt-en-zh@champion", "name": "nmt-en-zh", "version": "7",
          "run_id": "r7", "sha256": "ab" * 32}


@pytest.fixture(scope="module")
def tracking(project):
    """This project's store for MLflow calls in this process (other tests set their own)."""
    import mlflow

    uri = f"sqlite:///{project / 'mlflow.db'}"
    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    yield uri
    mlflow.set_tracking_uri(before[0])
    mlflow.set_registry_uri(before[1])


def promote(*args: str):
    """`python -m src.promote ARGS` in this process, on the store `tracking` set (a process of
    its own spends seconds importing MLflow; the one-line error is a process's, tested below)."""
    from typer.testing import CliRunner

    from src import promote as promote_command

    result = CliRunner().invoke(promote_command.app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture(scope="module")
def cli_translations(project):
    result = run_stage(project, "infer", "--onnx", str(project / "models/model.onnx"),
                       stdin="".join(s + "\n" for s in SENTENCES))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_artifacts_stay_in_the_project_whatever_the_working_directory(project, tracking):
    """Stages run here from the checkout, not the project: the artifacts still land in the
    project's mlruns/, beside its mlflow.db."""
    from mlflow import MlflowClient

    location = MlflowClient().get_experiment_by_name("nmt").artifact_location
    assert location == (project / "mlruns").resolve().as_uri()
    assert list((project / "mlruns").rglob("model.onnx"))


def test_export_registers_a_candidate_without_torch(tracking):
    import mlflow.pyfunc
    from mlflow import MlflowClient

    version = MlflowClient().get_model_version_by_alias("nmt-en-zh", "candidate")
    assert str(version.version) == "1"
    requirements = open(mlflow.pyfunc.get_model_dependencies("models:/nmt-en-zh@candidate")).read()
    assert "onnxruntime" in requirements and "sentencepiece" in requirements
    assert "torch" not in requirements


def test_the_served_model_never_imports_torch(project, tracking, cli_translations):
    """torch is installed here, as in most venvs: loading and predicting must still not import
    it (onnxruntime-extensions' package imports torch; a process with torch in it slowed
    CTranslate2 five-fold at two threads)."""
    code = ("import sys, mlflow.pyfunc; m = mlflow.pyfunc.load_model(sys.argv[1]); "
            "print(m.predict(sys.argv[2:])); "
            "print(sorted({'torch', 'onnxruntime_extensions'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code, "models:/nmt-en-zh@candidate",
                             *SENTENCES], cwd=REPO, capture_output=True, text=True,
                            env={**clean_environ(), "MLFLOW_TRACKING_URI": tracking}, timeout=300)
    assert result.returncode == 0, result.stderr
    translations, loaded = result.stdout.strip().splitlines()[-2:]
    assert translations == str(cli_translations)
    assert loaded == "[]"


def test_pyfunc_translates_a_list_and_a_dataframe_like_src_infer(tracking, cli_translations):
    import mlflow.pyfunc
    import pandas as pd

    model = mlflow.pyfunc.load_model("models:/nmt-en-zh@candidate")
    assert model.predict(SENTENCES) == cli_translations
    frame = pd.DataFrame({"text": SENTENCES})
    assert list(model.predict(frame)) == cli_translations
    greedy = model.predict(SENTENCES, params={"beam": 1})
    assert len(greedy) == len(SENTENCES)


def test_the_served_model_returns_scored_n_best_lists_when_asked(tracking, cli_translations):
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model("models:/nmt-en-zh@candidate")
    params = [p.name for p in model.metadata.get_params_schema().params]
    assert {"beam", "max_length", "n_best", "return_scores"} <= set(params)
    answers = model.predict(SENTENCES, params={"n_best": 2, "return_scores": True})
    assert [a["translation"] for a in answers] == cli_translations
    for a in answers:
        first, second = a["hypotheses"]
        assert first == {"translation": a["translation"], "score": a["score"]}
        assert second["score"] <= first["score"] and 0.0 <= a["confidence"] <= 1.0
    assert model.predict(SENTENCES) == cli_translations  # unchanged without them


def post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"{url}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_served_model_answers_like_src_infer_and_refuses_bad_requests(
        project, tracking, cli_translations, tmp_path):
    from src.core.local_servers import model_server

    with model_server("models:/nmt-en-zh@candidate", tmp_path,
                      {"MLFLOW_TRACKING_URI": tracking}) as (url, _log):
        status, body = post(url, json.dumps({"inputs": SENTENCES}).encode())
        assert status == 200, body
        assert json.loads(body)["predictions"] == cli_translations
        # our checks' reasons reach the client (a number is refused by the signature MLflow
        # enforces from predict's type hints, broken JSON by MLflow's parser: status only)
        bad = {
            "no sentences to translate": json.dumps({"inputs": []}).encode(),
            "has 20,000 characters": json.dumps({"inputs": ["word " * 4000]}).encode(),
            "param beam must be a whole number": json.dumps(
                {"inputs": ["Hi."], "params": {"beam": 1000}}).encode(),
            "param n_best 5 is more than the beam 3": json.dumps(
                {"inputs": ["Hi."], "params": {"beam": 3, "n_best": 5}}).encode(),
            "": json.dumps({"inputs": [42]}).encode(),
            " ": b'{"inputs": ["How are',
        }
        for reason, request in bad.items():
            status, body = post(url, request)
            assert 400 <= status < 500, (reason, status, body)
            assert reason.strip() in json.loads(body)["message"], (reason, body)
        # still serving
        status, body = post(url, json.dumps({"inputs": SENTENCES[:1]}).encode())
        assert status == 200 and json.loads(body)["predictions"] == cli_translations[:1]
        status, body = post(url, json.dumps({"inputs": SENTENCES[:1],
                                             "params": {"return_scores": True}}).encode())
        assert status == 200, body
        (answer,) = json.loads(body)["predictions"]
        assert answer["translation"] == cli_translations[0] and answer["score"] < 0
        # the load test, tiny: every request answered, a row per batch size and client count
        rows = tmp_path / "load.json"
        result = subprocess.run(
            [sys.executable, "-m", "bench.serving_load", "--url", url, "--requests", "8",
             "--clients", "1,4", "--batches", "1,4", "--onnx",
             str(project / "models/model.onnx"), "--json", str(rows)],
            cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        table = json.loads(rows.read_text())["rows"]
        assert [(r["via"], r["batch"], r["clients"]) for r in table] == [
            ("src.infer", 1, 1), ("http", 1, 1), ("http", 1, 4),
            ("src.infer", 4, 1), ("http", 4, 1), ("http", 4, 4)]
        assert all(r["errors"] == 0 and r["requests"] == 8 for r in table)


def test_a_serving_sitting_serves_the_registered_model_per_thread_count(project, tracking,
                                                                         tmp_path):
    """bench.serving_threads finds the project's registry from a server directory of its
    own, writes every row and prints the table from them."""
    out, sentences = tmp_path / "sitting.json", tmp_path / "sentences.txt"
    sentences.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking}
    result = subprocess.run(
        [sys.executable, "-m", "bench.serving_threads", "run", "--json", str(out),
         "--rounds", "2", "--threads", "1,2", "--batches", "1,2", "--clients", "1",
         "--sentences-per-row", "2", "--warmup", "0", "--sentences", str(sentences)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    sitting = json.loads(out.read_text())
    assert sitting["model"] == "models:/nmt-en-zh@candidate (version 1)"
    assert [(r["round"], r["threads"], r["batch"], r["requests"], r["errors"])
            for r in sitting["rows"]] == [
        (1, 1, 1, 2, 0), (1, 1, 2, 1, 0), (1, 2, 1, 2, 0), (1, 2, 2, 1, 0),
        (2, 2, 1, 2, 0), (2, 2, 2, 1, 0), (2, 1, 1, 2, 0), (2, 1, 2, 1, 0)]
    assert "| 2 | 1 | " in result.stdout and "errors: 0." in result.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "bench.serving_threads", "run", "--json", str(out), "--model",
         "models:/nmt-en-zh@nobody"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: nmt-en-zh has no alias 'nobody' in sqlite:")
    assert len(missing.stderr.splitlines()) == 1


def uv() -> str | None:
    """uv (a dev dependency) from this venv or PATH: it builds environments in seconds."""
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


def bare_environ() -> dict[str, str]:
    """No PYTHONPATH, no MLflow store, no venv of ours on PATH: what a deployment has."""
    drop = {"PYTHONPATH", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    ours = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    return env


def fresh_venv(where: Path, *pip_args: str) -> Path:
    """A virtual environment with only what `pip_args` install; returns its python."""
    if uv():
        subprocess.run([uv(), "venv", "-q", "--python", sys.executable, str(where)],
                       check=True, env=bare_environ(), timeout=300)
        python = where / "bin" / "python"
        install = [uv(), "pip", "install", "-q", "--python", str(python)]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
        python = where / "bin" / "python"
        install = [str(python), "-m", "pip", "install", "-q"]
    result = subprocess.run(install + list(pip_args), capture_output=True, text=True,
                            env=bare_environ(), timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return python


@pytest.mark.venv
def test_the_registered_model_runs_in_an_environment_of_its_own_requirements(
        tracking, cli_translations, tmp_path):
    """What `mlflow models serve --env-manager uv|virtualenv` and build-docker do: install the
    model's requirements.txt and nothing else (no typer, torch, dvc), then load and predict."""
    import mlflow

    model_dir = Path(mlflow.artifacts.download_artifacts("models:/nmt-en-zh@candidate",
                                                         dst_path=str(tmp_path / "model")))
    requirements = model_dir / "requirements.txt"
    python = fresh_venv(tmp_path / "venv", "-r", str(requirements))
    script = ("import json, sys, mlflow.pyfunc\n"
              "model = mlflow.pyfunc.load_model(sys.argv[1])\n"
              "print(json.dumps(model.predict(json.loads(sys.argv[2]))))\n")
    result = subprocess.run([str(python), "-c", script, str(model_dir), json.dumps(SENTENCES)],
                            cwd=tmp_path, capture_output=True, text=True, env=bare_environ(),
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == cli_translations
    # and the text models' operators are declared, since the text files are in the model
    assert "onnxruntime-extensions==" in requirements.read_text()


@pytest.mark.venv
@pytest.mark.skipif(uv() is None, reason="uv is not installed")
def test_mlflow_serves_the_model_in_an_environment_it_builds_with_uv(
        tracking, cli_translations, tmp_path):
    from src.core.local_servers import model_server

    env = {**bare_environ(), "MLFLOW_TRACKING_URI": tracking,
           "PATH": os.pathsep.join([str(Path(uv()).parent), bare_environ()["PATH"]])}
    with model_server("models:/nmt-en-zh@candidate", tmp_path, env, start_timeout_s=1200,
                      env_manager="uv") as (url, _log):
        status, body = post(url, json.dumps({"inputs": SENTENCES}).encode())
    assert status == 200, body
    assert json.loads(body)["predictions"] == cli_translations


@pytest.mark.venv
def test_src_infer_runs_with_only_the_packages_the_readme_names(project, cli_translations,
                                                                tmp_path):
    """The README: `src.infer` (and `src.score`) need only onnxruntime, numpy, sentencepiece
    and typer."""
    readme = (REPO / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("`src.infer` needs only"))
    packages = ["onnxruntime", "numpy", "sentencepiece", "typer"]
    assert all(name in line for name in packages), line
    python = fresh_venv(tmp_path / "venv", *packages)
    # the checkout's code on the path, as a client that copies src/ would have it
    env = {**bare_environ(), "PYTHONPATH": str(REPO), "NMT_ROOT": str(project)}
    result = subprocess.run([str(python), "-m", "src.infer", "--onnx",
                             str(project / "models/model.onnx")],
                            input="".join(s + "\n" for s in SENTENCES), cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == cli_translations
    # `src.score` too, with the scoring file
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{s}\t{t}\n" for s, t in zip(SENTENCES, cli_translations)),
                     encoding="utf-8")
    scored = subprocess.run([str(python), "-m", "src.score", str(pairs), "--onnx",
                             str(project / "models/model.score.onnx")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert len(scored.stdout.splitlines()) == len(SENTENCES)


def test_promote_moves_champion_to_a_better_candidate_only(project, tracking):
    from mlflow import MlflowClient

    env_root = project
    first = promote("--dry-run")
    assert first.exit_code == 0 and "would promote version 1" in first.stdout, first.output
    promoted = promote()
    assert "version 1" in promoted.stdout and "is the champion" in promoted.stdout
    client = MlflowClient()
    assert str(client.get_model_version_by_alias("nmt-en-zh", "champion").version) == "1"
    again = promote()
    assert "already the champion" in again.stdout
    # a worse candidate (the same files, registered from a run that scored lower) is not promoted
    import mlflow

    with mlflow.start_run() as worse_run:
        mlflow.log_metric("fp32_bleu", 1.0)
    first_version = client.get_model_version("nmt-en-zh", "1")
    worse = client.create_model_version("nmt-en-zh", first_version.source,
                                        run_id=worse_run.info.run_id)
    client.set_registered_model_alias("nmt-en-zh", "candidate", worse.version)
    kept = promote()
    assert "kept champion version 1" in kept.stdout, kept.output
    assert str(client.get_model_version_by_alias("nmt-en-zh", "champion").version) == "1"
    # a better one is: the champion moves from version 1 to it
    with mlflow.start_run() as better_run:
        mlflow.log_metric("fp32_bleu", 99.0)
    better = client.create_model_version("nmt-en-zh", first_version.source,
                                         run_id=better_run.info.run_id)
    client.set_registered_model_alias("nmt-en-zh", "candidate", better.version)
    moved = promote()
    assert f"version {better.version} is the champion over version 1: rule 1 held (fp32_bleu " \
           "99.00 vs" in moved.stdout, moved.output
    assert client.get_model_version_by_alias("nmt-en-zh", "champion").version == better.version
    missing = run_stage(env_root, "promote", "--name", "nmt-xx-yy", tracking=True)
    assert missing.returncode == 1 and "no version of nmt-xx-yy" in missing.stderr


def test_a_version_keeps_its_weights_scores_and_parent(project, tracking):
    """What a later run needs to start from the version (train.init_from), what promote's
    rule 2 compares, and the lineage the UI shows."""
    from mlflow import MlflowClient

    client = MlflowClient()
    version = client.get_model_version("nmt-en-zh", "1")
    names = {Path(f.path).name for f in client.list_artifacts(version.run_id, "weights")}
    assert names == {"model.pt", "tokenizer"}
    metrics = client.get_run(version.run_id).data.metrics
    assert (metrics["eval.test_sets.old.bleu"], metrics["eval.bleu"]) == (30.0, 12.5)
    assert {k: version.tags[k] for k in ("parent_name", "parent_version", "parent_sha256",
                                         "init_from")} == {
        "parent_name": "nmt-en-zh", "parent_version": "7", "parent_sha256": "ab" * 32,
        "init_from": "models:/nmt-en-zh@champion"}
    assert version.description.startswith("Trained from nmt-en-zh version 7 (models:/")


def test_promote_keeps_a_better_candidate_that_forgot_an_old_set_and_prints_lineage(
        project, tracking):
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient()
    source = client.get_model_version("nmt-en-zh", "1").source

    def version_scoring(bleu: float, old: float, parent: str | None = None) -> str:
        with mlflow.start_run() as run:
            mlflow.log_metrics({"fp32_bleu": bleu, "eval.test_sets.old.bleu": old})
        tags = {"parent_name": "nmt-en-zh", "parent_version": parent} if parent else None
        made = client.create_model_version("nmt-en-zh", source, run_id=run.info.run_id,
                                           tags=tags)
        return str(made.version)

    champion = version_scoring(150.0, 30.0)
    client.set_registered_model_alias("nmt-en-zh", "champion", champion)
    forgot = version_scoring(160.0, 29.0, parent=champion)
    client.set_registered_model_alias("nmt-en-zh", "candidate", forgot)
    kept = promote("--dry-run")
    assert kept.stdout.splitlines() == [
        f"lineage: version {forgot} <- version {champion}",
        f"promote: kept champion version {champion}; candidate version {forgot}: rule 2 (at "
        "most 0.5 BLEU below the champion on each old test set) failed on old: 29.00 vs 30.00"]
    loose = promote("--margin", "1.5")
    assert f"version {forgot} is the champion over version {champion}: rule 1 held " \
           "(fp32_bleu 160.00 vs 150.00) and rule 2 held (old 29.00 vs 30.00, margin 1.5)" in \
           loose.stdout, loose.output
