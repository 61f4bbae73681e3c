"""End to end: the real `dvc repro` in a temporary copy of the repo, on the toy corpus with a
tiny model; checks every stage's outputs, the MLflow runs, the no-op re-run, which stages a
change reaches, `dvc exp run -S`, and `dvc metrics show`.

`project` is reproduced once per module and only read; a test that changes it gets its own copy
(`workspace`), so the tests pass in any order or alone."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sacrebleu
import yaml
from helpers import GIT_ENV, TINY_PARAMS, git_project, sh, write_pairs
from hub_repos import sacrebleu_set
from toy_corpus import toy_tsv

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent
TINY = {
    **TINY_PARAMS,
    "train": {
        "epochs": 2,
        "max_tokens": 1000,
        "warmup_steps": 10,
        "log_every_steps": 5,
        "average_best": 2,
        "threads": 1,
    },
    "evaluate": {"beam_size": 2, "num_samples": 5},
    # PyTorch's search beside ONNX Runtime's on a share of the 108 test sentences: the export
    # checks its parity the same way at any count, and each export re-run is seconds shorter
    "export": {"parity_sentences": 24},
}


# Two named test sets scored beside the test split: one of sacreBLEU's (read from a pre-filled
# $SACREBLEU, as sacreBLEU caches a fetched set) and a local file
NEWS = [("The market rose today.", "今天市场上涨了。"), ("Prices fell again.", "价格又下跌了。")]
MINE = [("I like green tea.", "我喜欢绿茶。")]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    archive = root.parent / "toy-corpus.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("cmn.txt", toy_tsv())
    sacrebleu_set(root.parent / "sacrebleu", "wmt20", "en-zh", NEWS)
    mine = root.parent / "mine.tsv"
    write_pairs(mine, MINE)
    settings = {f"{section}.{key}": value
                for section, values in TINY.items() for key, value in values.items()}
    test_sets = [{"name": "news", "sacrebleu": "wmt20"}, {"name": "mine", "url": str(mine)}]
    os.environ["SACREBLEU"] = str(root.parent / "sacrebleu")  # for every dvc call of the module
    git_project(root, {"download.url": archive.as_uri(), "download.test_sets": test_sets,
                       **settings})
    # MLflow samples system metrics every 10 s and logs none for a shorter run: sample every
    # 0.1 s, so the toy training (a second or two) gets some
    seen = watched_repro(root, {"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.1"})
    (root.parent / "seen.json").write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))
    return root


# The statuses of the repro run whenever one of its stage runs is RUNNING, read from the store
# with plain SQL as the UI's server would: fast enough to catch a toy stage mid-run (MLflow's
# client takes longer per look than evaluate takes to run).
RUNNING_STAGES = """SELECT t.value, p.status FROM runs s
                    JOIN tags t ON t.run_uuid = s.run_uuid AND t.key = 'stage'
                    JOIN tags l ON l.run_uuid = s.run_uuid AND l.key = 'mlflow.parentRunId'
                    JOIN runs p ON p.run_uuid = l.value
                    WHERE s.status = 'RUNNING'"""


def watched_repro(root: Path, env: dict[str, str]) -> dict[str, set[str]]:
    """`dvc repro` in `root` (its output in repro.log beside it), watched from outside while it
    runs: each stage seen RUNNING -> the statuses its repro run had meanwhile."""
    import sqlite3
    import time

    base = {k: v for k, v in os.environ.items()
            if k not in {"NMT_TRACKING", "NMT_ROOT", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"}}
    log = root.parent / "repro.log"
    with log.open("w") as out:
        repro = subprocess.Popen(["dvc", "repro"], cwd=root, env={**base, **GIT_ENV, **env},
                                 stdout=out, stderr=subprocess.STDOUT)
    seen: dict[str, set[str]] = {}
    try:
        while repro.poll() is None:
            time.sleep(0.05)
            try:
                with sqlite3.connect(f"file:{root / 'mlflow.db'}?mode=ro", uri=True) as db:
                    rows = db.execute(RUNNING_STAGES).fetchall()
            except sqlite3.OperationalError:  # not made yet, or locked mid-write: look again
                continue
            for stage, parent_status in rows:
                seen.setdefault(stage, set()).add(parent_status)
    finally:
        repro.wait(timeout=900)
    assert repro.returncode == 0, log.read_text()
    return seen


@pytest.fixture
def workspace(project: Path, tmp_path: Path) -> Path:
    """A private copy of the reproduced project (git, DVC cache, MLflow store) to change."""
    copy = tmp_path / "project"
    shutil.copytree(project, copy, symlinks=True)
    return copy


def mlflow_runs(root: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["nmt"], output_format="list")


def test_every_stage_wrote_its_outputs(project):
    from datasets import load_from_disk

    assert (project / "data/raw/corpus.tsv").read_text(encoding="utf-8") == toy_tsv()
    meta = json.loads((project / "data/download.json").read_text())
    corpus = (project / "data/raw/corpus.tsv").read_bytes()
    assert meta["corpora"][0]["corpus_sha256"] == hashlib.sha256(corpus).hexdigest()
    assert meta["test"] is None
    splits = load_from_disk(str(project / "data/split"))
    counts = json.loads((project / "data/split_stats.json").read_text())
    assert counts["kept"] == 1080 and counts["n_train"] == len(splits["train"])
    assert {"train", "valid", "test", "test_news", "test_mine"} == set(splits)
    for name in ("source.model", "target.model", "tokenizer.json"):
        assert (project / "models/tokenizer" / name).exists()
    tokenized = load_from_disk(str(project / "data/tokenized"))
    assert "source_ids" in tokenized["test"].column_names
    assert (project / "models/model.pt").exists()
    assert (project / "models/checkpoints/last.pt").exists()
    train = json.loads((project / "models/train_stats.json").read_text())
    assert train["epochs"] == 2 and train["averaged_epochs"] == 2  # average_best: 2
    assert (project / "models/train_curve.csv").read_text().startswith("step,loss,lr")
    valid = list(csv.DictReader((project / "models/valid_curve.csv").open()))
    assert [int(r["epoch"]) for r in valid] == [1, 2] and "valid_bleu" in valid[0]
    result = json.loads((project / "data/eval/stats.json").read_text())
    assert result["bleu_tokenizer"] == "zh" and result["sentences"] == len(splits["test"])
    # every toy sentence has four words: one bucket, which is then the whole test split
    assert result["sentences_le6w"] == len(splits["test"]) and "bleu_7to9w" not in result
    assert result["bleu_le6w"] == result["bleu"]
    with (project / "data/eval/translations.tsv").open(encoding="utf-8", newline="") as fh:
        written = list(csv.DictReader(fh, delimiter="\t"))
    rows = [r for r in written if r["set"] == "test"]
    assert [r["source"] for r in rows] == list(splits["test"]["source"])
    # each named set scored on its own, from the translations written beside the scores
    for name, pairs in (("news", NEWS), ("mine", MINE)):
        own = [r for r in written if r["set"] == name]
        assert [(r["source"], r["reference"]) for r in own] == pairs
        scored = result["test_sets"][name]
        assert scored["sentences"] == len(pairs) and "tok:zh" in scored["bleu_signature"]
        again = sacrebleu.corpus_chrf([r["hypothesis"] for r in own], [[r["reference"]
                                                                       for r in own]])
        assert scored["chrf"] == round(again.score, 2)
    # The reported BLEU is the BLEU of the translations written beside it.
    rescored = sacrebleu.corpus_bleu([r["hypothesis"] for r in rows],
                                     [[r["reference"] for r in rows]], tokenize="zh")
    assert result["bleu"] == round(rescored.score, 2)
    assert (project / "models/model.onnx").exists()


# What `dvc exp show` and `dvc metrics diff` compare. A key added to a metrics file becomes a
# column in every user's table: diagnostics belong in the *stats.json files and MLflow.
HEADLINE_METRICS = {
    "models/train_metrics.json": {"valid_bleu", "train_minutes", "tokens_per_s"},
    # toy: one length bucket; how the confidence catches bad translations; each named test
    # set's headline under test_sets
    "data/eval/metrics.json": {"bleu", "chrf", "bleu_le6w", "chrf_le6w", "review_catch_10",
                               "test_sets"},
    "models/export_metrics.json": {"fp32_bleu", "fp32_size_mb", "fp32_sentences_per_s",
                                   "int8_bleu", "int8_size_mb", "int8_sentences_per_s"},
}


def test_repro_prints_no_python_warnings(project):
    """A user reads the repro's output; a library warning repeated per dataset is noise (MLflow
    warned on every dataset input until tracking silenced its duplicate source class)."""
    output = (project.parent / "repro.log").read_text()
    assert [line for line in output.splitlines() if "Warning:" in line] == []
    # DVC warned "'data/raw/test.tsv' is empty." three times per run with no predefined test set
    assert [line for line in output.splitlines() if "is empty" in line] == []
    # DVC's "No file hash info found for 'models/parent'", MLflow's "Union type hint is
    # inferred as AnyType" at export: warnings a user can do nothing about
    assert [line for line in output.splitlines() if "warning" in line.lower()] == []


def test_each_epoch_is_one_line_of_the_log(project):
    """Printed to a pipe, rich wrapped the epoch line at 80 columns ('... 4,094 \\ntok/s')."""
    lines = (project.parent / "repro.log").read_text().splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and max(map(len, epochs)) > 80, epochs  # long enough to have wrapped
    assert all(line.endswith("tok/s") for line in epochs), epochs


def test_a_log_that_is_not_a_terminal_shows_progress_between_epochs(project):
    """DVC pipes train's output, where the progress bar draws nothing: a line every
    train.log_every_steps (5) steps says where training is."""
    lines = [line for line in (project.parent / "repro.log").read_text().splitlines()
             if line.startswith("train: step ")]
    steps = json.loads((project / "models/train_stats.json").read_text())["steps"]
    assert len(lines) == steps // 5 and steps // 5 >= 2, lines
    assert all(" tok/s, epoch ETA " in line for line in lines), lines
    assert lines[0].startswith("train: step 5, epoch 1/2 batch 5/")


def test_metrics_files_hold_only_headline_numbers(project):
    declared = {next(iter(m)) if isinstance(m, dict) else m
                for stage in yaml.safe_load((project / "dvc.yaml").read_text())["stages"].values()
                for m in stage.get("metrics", [])}
    assert declared == set(HEADLINE_METRICS)
    for path, keys in HEADLINE_METRICS.items():
        metrics = json.loads((project / path).read_text())
        stats = json.loads((project / path.replace("metrics", "stats")).read_text())
        if "confidence_auroc" in stats:  # only when the toy model has good and bad outputs
            keys = keys | {"confidence_auroc"}
        assert set(metrics) == keys, path
        for name, scores in metrics.pop("test_sets", {}).items():
            own = stats["test_sets"][name]
            assert set(scores) == (keys - {"test_sets", "confidence_auroc"}) | (
                {"confidence_auroc"} & set(own))
            assert {k: own[k] for k in scores} == scores
        assert {k: stats[k] for k in keys - {"test_sets"}} == metrics  # the same numbers


def test_mlflow_runs_are_grouped_and_complete(project):
    from mlflow import MlflowClient

    runs = mlflow_runs(project)
    stages = {r.data.tags.get("stage"): r for r in runs if r.data.tags.get("kind") == "stage"}
    assert {"download", "split", "tokenize", "train", "evaluate", "export"} <= set(stages)
    groups = {r.data.tags["repro_id"] for r in stages.values()}
    assert len(groups) == 1
    parents = [r for r in runs if r.data.tags.get("kind") == "repro"]
    assert [p.data.tags["repro_id"] for p in parents] == list(groups)
    assert all(
        r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in stages.values()
    )
    train = stages["train"]
    assert train.data.params["train.epochs"] == "2"
    assert "data.data/tokenized" in train.data.tags  # md5 from dvc.lock
    stats = json.loads((project / "models/train_stats.json").read_text())
    assert train.data.tags["precision"] == stats["precision"]  # a tag: text fails log_metrics
    # DVC's `python -m src.train` restarted itself on tcmalloc where the machine has it
    from src.training.host_memory import find_tcmalloc, own_malloc
    assert stats["allocator"] == train.data.tags["allocator"] == (
        "tcmalloc" if find_tcmalloc() else own_malloc())
    client = MlflowClient()
    assert len(client.get_metric_history(train.info.run_id, "train_loss")) >= 2
    assert len(client.get_metric_history(train.info.run_id, "valid_loss")) == 2
    assert len(client.get_metric_history(train.info.run_id, "valid_bleu")) == 2  # select_by
    assert "bleu" in stages["evaluate"].data.metrics and "chrf" in stages["evaluate"].data.metrics
    assert [a.path for a in client.list_artifacts(train.info.run_id)] == ["model"]
    assert any(key.startswith("system/cpu") for key in train.data.metrics)
    assert not any(key.startswith("system/") for key in stages["evaluate"].data.metrics)
    # MLflow 3's UI opens a model-training experiment on its runs table
    experiment = client.get_experiment(train.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    tok_artifacts = client.list_artifacts(stages["tokenize"].info.run_id, "tokenizer")
    assert {Path(a.path).name for a in tok_artifacts} >= {"source.model", "tokenizer.json"}


def test_runs_record_the_data_they_used(project):
    """Dataset inputs named after the split, digest = DVC's hash of the data the stage read."""
    runs = mlflow_runs(project)
    stages = {r.data.tags.get("stage"): r for r in runs if r.data.tags.get("kind") == "stage"}
    outs = {o["path"]: o["md5"].removesuffix(".dir")
            for stage in yaml.safe_load((project / "dvc.lock").read_text())["stages"].values()
            for o in stage.get("outs", [])}

    def inputs(stage: str) -> dict[str, tuple[str, str]]:
        return {d.dataset.name: (d.dataset.digest,
                                 {t.key: t.value for t in d.tags}["mlflow.data.context"])
                for d in stages[stage].inputs.dataset_inputs}

    tokenized = outs["data/tokenized"]
    assert inputs("train") == {"train": (tokenized, "training"),
                               "valid": (tokenized, "validation")}
    assert inputs("evaluate") == dict.fromkeys(("test", "test_news", "test_mine"),
                                               (tokenized, "evaluation"))
    assert inputs("export") == {"test": (tokenized, "evaluation")}
    # download: each corpus and named test set, its digest the TSV's sha256, its source where
    # it came from (sacreBLEU's own URL for a sacreBLEU set)
    meta = json.loads((project / "data/download.json").read_text())
    fetched = {one["name"]: one["corpus_sha256"][:12]
               for one in meta["corpora"] + meta["test_sets"]}
    assert inputs("download") == {"corpus": (fetched["corpus"], "training"),
                                  "news": (fetched["news"], "evaluation"),
                                  "mine": (fetched["mine"], "evaluation")}
    sources = {d.dataset.name: json.loads(d.dataset.source)
               for d in stages["download"].inputs.dataset_inputs}
    assert sources["news"]["url"] == meta["test_sets"][0]["urls"][0]
    assert "evaluate" in stages and "news_bleu" in stages["evaluate"].data.metrics
    assert {name: digest for name, (digest, _) in inputs("tokenize").items()} == {
        name: outs["data/split"] for name in ("train", "valid", "test")}
    # the parent run of the repro lists them all, so the runs table shows them unexpanded
    parent = next(r for r in runs if r.data.tags.get("kind") == "repro")
    assert {(d.dataset.name, d.dataset.digest) for d in parent.inputs.dataset_inputs} == {
        *((name, tokenized) for name in ("train", "valid", "test", "test_news", "test_mine")),
        *fetched.items()}



def test_plots_draw_loss_valid_loss_valid_bleu_and_risk_coverage(workspace):
    """Four titled, labelled charts with data, defined top-level so experiments overlay."""
    charts = json.loads(sh(workspace, "dvc", "plots", "show", "--json"))["data"]
    assert set(charts) == {"Training loss", "Validation loss", "Validation BLEU",
                           "Risk-coverage"}
    for name, (chart,) in charts.items():
        spec = chart["content"]
        y = spec["layer"][0]["encoding"]["y"]
        assert spec["title"]["text"] and spec["encoding"]["x"]["title"] and y["title"], name
        assert all(row[y["field"]] != "" for row in spec["data"]["values"]), name
    assert len(charts["Validation BLEU"][0]["content"]["data"]["values"]) == 2  # epochs
    kept = [float(r["coverage"]) for r in charts["Risk-coverage"][0]["content"]["data"]["values"]]
    assert kept == [round(k / 20, 4) for k in range(1, 21)]

def finished_repro_run(root: Path, group: str, timeout_s: float = 90.0):
    """The repro run of `group` once repro_watch has ended it (it polls the exited dvc)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        parent = next(r for r in mlflow_runs(root)
                      if r.data.tags.get("kind") == "repro"
                      and r.data.tags.get("repro_id") == group)
        if parent.info.status != "RUNNING" or time.monotonic() > deadline:
            return parent
        time.sleep(0.5)


def test_the_repro_run_spans_the_whole_repro(project):
    """Each stage used to end the repro run: the UI showed a repro training for an hour as
    FINISHED, duration 11 s (the first stage's)."""
    stages = [r for r in mlflow_runs(project) if r.data.tags.get("kind") == "stage"]
    parent = finished_repro_run(project, stages[0].data.tags["repro_id"])
    assert parent.info.status == "FINISHED"
    assert parent.info.start_time <= min(r.info.start_time for r in stages)
    assert parent.info.end_time >= max(r.info.end_time for r in stages)


def test_the_repro_run_reads_running_while_any_stage_runs(project):
    """Watched from outside while `dvc repro` ran every stage: whenever one of its stage runs
    was RUNNING, so was the repro run, at the later stages too."""
    seen = json.loads((project.parent / "seen.json").read_text())
    assert len(seen) >= 4 and set(seen) <= {"download", "split", "tokenize", "train",
                                            "evaluate", "export"}, seen
    assert all(statuses == ["RUNNING"] for statuses in seen.values()), seen


# For a repro whose test is which stages DVC runs, not what MLflow records (the setup's repro and
# the fine-tune experiment check that): a tracked stage spends about 4 s importing MLflow
UNTRACKED = {"NMT_TRACKING": "off"}


def stages_run(out: str) -> set[str]:
    return {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}


def test_second_repro_does_nothing(workspace):
    """After a repro, `dvc status` is clean and a second repro runs no stage (the parent stage
    was once always_changed and ran at every repro)."""
    before = len(mlflow_runs(workspace))
    assert "Data and pipelines are up to date." in sh(workspace, "dvc", "status")
    out = sh(workspace, "dvc", "repro")
    assert stages_run(out) == set(), out
    assert "Data and pipelines are up to date." in sh(workspace, "dvc", "status")
    assert len(mlflow_runs(workspace)) == before


def add_test_set(root: Path, name: str, pairs: list[tuple[str, str]]) -> None:
    tsv = write_pairs(root.parent / f"{name}.tsv", pairs)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["download"]["test_sets"].append({"name": name, "url": str(tsv)})
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_a_train_change_reaches_train_first(workspace):
    """A `train.*` key is a dependency of train alone: a repro re-runs train and the stages
    that read its outputs, never the data stages."""
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["train"]["max_steps"] = 7
    (workspace / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert set(json.loads(sh(workspace, "dvc", "status", "--json"))) == {"train"}


def test_a_new_test_set_is_scored_without_retraining(workspace):
    """A named test set that shares no source with the training pairs changes neither the
    training data nor the tokenizer: evaluate scores it and train does not run again (the
    repro up to evaluate, which would run train first were it stale; export, after it, adds
    nothing here and is a toy export's seconds)."""
    model = (workspace / "models/model.pt").read_bytes()
    owls = ("Seven purple owls sang loudly.", "七只紫色的猫头鹰大声唱歌。")
    add_test_set(workspace, "fresh", [owls])
    out = sh(workspace, "dvc", "repro", "evaluate", env=UNTRACKED)
    ran = stages_run(out)
    assert {"download", "split", "tokenize", "evaluate"} <= ran, out
    assert "train" not in ran, out
    assert (workspace / "models/model.pt").read_bytes() == model
    metrics = json.loads((workspace / "data/eval/metrics.json").read_text())
    assert set(metrics["test_sets"]) == {"news", "mine", "fresh"}


def test_a_fine_tune_from_the_alias_the_pipeline_moves_as_an_experiment_logged_to_a_server(
        workspace, tmp_path):
    """`dvc exp run -S train.init_from=models:/nmt-en-zh@candidate`: a `train.*` change, so
    parent, train and the later stages run, and the experiment's metrics (each named test
    set's too) sit beside the workspace's in `dvc exp show`. Its export moves `candidate` to
    the new version, and the next repro must not read it again (it once retrained at every
    repro: version 1 -> 2 -> 3). Reading the alias again is asked for by name, and says what
    it found.

    It logs to a tracking server, as a team's would, whose store holds the workspace's runs
    and registry (a copy of its mlflow.db): the alias is read from the server, and each stage's
    run, the curves and the newly registered version land there."""
    import mlflow

    from src.core.local_servers import mlflow_server

    assert "bleu" in sh(workspace, "dvc", "metrics", "show")
    sh(workspace, "git", "add", "-A")
    sh(workspace, "git", "commit", "-qm", "lock")
    server = tmp_path / "server"
    server.mkdir()
    shutil.copy(workspace / "mlflow.db", server / "server.db")
    with mlflow_server(server) as (uri, _):
        on_server = {"MLFLOW_TRACKING_URI": uri}
        out = sh(workspace, "dvc", "exp", "run", "-S",
                 "train.init_from=models:/nmt-en-zh@candidate", "-S", "train.max_steps=3",
                 env=on_server)
        ran = stages_run(out)
        # tokenize too: the parent's tokenizer replaces the workspace's
        assert {"parent", "tokenize", "train", "evaluate", "export"} <= ran, out
        assert not ran & {"download", "split"}, out
        assert json.loads((workspace / "models/train_stats.json").read_text())["steps"] == 3
        assert "parent: models:/nmt-en-zh@candidate = nmt-en-zh version 1" in out
        assert "dvc repro -f -s parent" in out  # the one line says how to read it again
        record = json.loads((workspace / "models/parent/parent.json").read_text())
        assert record["version"] == "1"
        # every stage that ran has its finished run on the server, in this repro's group
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        experiment_id = client.get_experiment_by_name("nmt").experiment_id
        latest = client.search_runs([experiment_id], "tags.kind = 'stage'",
                                    order_by=["attribute.start_time DESC"], max_results=1)
        group = latest[0].data.tags["repro_id"]
        stages = {r.data.tags["stage"]: r for r in client.search_runs(
            [experiment_id], f"tags.kind = 'stage' and tags.repro_id = '{group}'")}
        assert {"tokenize", "train", "evaluate", "export"} <= set(stages) <= ran, stages
        assert all(r.info.status == "FINISHED" for r in stages.values())
        assert "bleu" in stages["evaluate"].data.metrics
        assert client.get_metric_history(stages["train"].info.run_id, "valid_loss")  # 1 epoch
        candidate = client.get_model_version_by_alias("nmt-en-zh", "candidate")
        assert (candidate.version, candidate.run_id) == ("2", stages["export"].info.run_id)
        # `models:/` URIs resolve through the process-wide registry URI
        before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        try:
            model_dir = mlflow.artifacts.download_artifacts("models:/nmt-en-zh@candidate")
        finally:
            mlflow.set_tracking_uri(before[0])
            mlflow.set_registry_uri(before[1])
        assert (Path(model_dir) / "artifacts/model.onnx").read_bytes() == (
            workspace / "models/model.onnx").read_bytes()
        # The experiment's own metrics are kept with it (git-tracked small files), so
        # experiments compare side by side in `dvc exp show`.
        rows = list(csv.DictReader(io.StringIO(sh(workspace, "dvc", "exp", "show", "--csv"))))
        experiment = [r for r in rows if r.get("train.max_steps") == "3" and r.get("Experiment")]
        assert experiment and experiment[0]["bleu"] not in ("", "!"), rows
        # each named test set is a column of its own beside the test split's
        assert experiment[0]["test_sets.news.bleu"] not in ("", "!"), rows
        diff = sh(workspace, "dvc", "metrics", "diff", "HEAD", "--all")
        assert "test_sets.news.chrf" in diff and "test_sets.mine.bleu" in diff
        out = sh(workspace, "dvc", "repro", env=on_server)
        assert stages_run(out) == set(), out
        assert "Data and pipelines are up to date." in sh(workspace, "dvc", "status")
        # asked for: the alias is read again (now version 2, the experiment's export)
        out = sh(workspace, "dvc", "repro", "-f", "-s", "parent", env=on_server)
        assert "nmt-en-zh version 2" in out
        record = json.loads((workspace / "models/parent/parent.json").read_text())
        assert record["version"] == "2"


def test_dvc_remote_push_then_pull_restores_the_model(workspace, tmp_path):
    """A teammate pulls the trained model from a DVC remote instead of retraining."""
    model = workspace / "models/model.onnx"
    expected = model.read_bytes()
    sh(workspace, "dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh(workspace, "dvc", "push")
    shutil.rmtree(workspace / ".dvc/cache")
    model.unlink()
    # A fresh clone has no training checkpoints: they are local resume state, never pushed.
    shutil.rmtree(workspace / "models/checkpoints")
    sh(workspace, "dvc", "pull")
    assert model.read_bytes() == expected
    assert stages_run(sh(workspace, "dvc", "repro")) == set()  # nothing to retrain


def test_a_test_set_holding_training_sources_drops_them_and_reaches_every_later_stage(
        workspace):
    """A named test set that holds a training source drops that pair from training: download
    and split run, and tokenize, which reads the split, is stale (DVC runs every stage after
    it from there; the fine-tune test runs such a chain)."""
    from datasets import load_from_disk

    train = load_from_disk(str(workspace / "data/split"))["train"]
    add_test_set(workspace, "overlap", [(train[0]["source"], train[0]["target"])])
    out = sh(workspace, "dvc", "repro", "split", env=UNTRACKED)
    assert stages_run(out) == {"download", "split"}, out
    sources = set(load_from_disk(str(workspace / "data/split"))["train"]["source"])
    assert train[0]["source"] not in sources and len(sources) < len(set(train["source"]))
    assert set(json.loads(sh(workspace, "dvc", "status", "--json"))) == {"tokenize"}


def test_the_train_step_benchmark_times_and_profiles_the_stages_own_step(project, tmp_path):
    """bench.train_step_speed (docs/training_speed.md's profile) on the reproduced
    project: the train stage's batches and Trainer, one row per precision asked for."""
    out = tmp_path / "steps.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "bench.train_step_speed", "--precision", "fp32",
         "--steps", "4", "--warmup", "1", "--epoch", "0", "--profile", "1", "--threads", "1",
         "--window", "2", "--out", str(out)],
        cwd=REPO, env={**os.environ, "NMT_ROOT": str(project)}, capture_output=True,
        text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["precision"], row["steps"], row["threads"], row["epoch"]) == ("fp32", 4, 1, 0)
    assert "Self CPU" in result.stdout  # the profiler's table of the profiled step
    assert len(row["tokens_per_s_by_2_steps"]) == 2  # two windows of two steps
    # restarted on tcmalloc (auto) where the machine has it, as the train stage is
    from src.training.host_memory import find_tcmalloc, own_malloc
    assert row["allocator"] == ("tcmalloc" if find_tcmalloc() else own_malloc())
