"""repro_watch: the process that ends a `dvc repro`'s MLflow run when dvc exits."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from src.core import repro_watch


def test_waits_until_the_process_has_exited():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    start = time.monotonic()
    repro_watch.wait_for_exit(child.pid, poll_s=0.05)  # an unreaped child is a zombie: exited
    assert time.monotonic() - start >= 0.5
    child.wait()
    repro_watch.wait_for_exit(child.pid, poll_s=0.05)  # gone altogether: returns at once


@pytest.fixture
def client(tmp_path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


def repro_with_stage(client, stage_status: str | None):
    experiment = client.create_experiment("nmt")
    parent = client.create_run(experiment).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
    if stage_status:
        client.set_terminated(child, stage_status)
    return parent, child


def test_ends_a_running_repro_finished_once_its_stages_are_closed(client):
    parent, _ = repro_with_stage(client, "FINISHED")
    assert repro_watch.finish(client, parent, settle_s=5, poll_s=0.05) == "FINISHED"
    run = client.get_run(parent).info
    assert run.status == "FINISHED" and run.end_time >= run.start_time


def test_leaves_a_failed_or_killed_repro_as_its_stage_ended_it(client):
    parent, _ = repro_with_stage(client, "KILLED")
    client.set_terminated(parent, "KILLED")  # what the stopped stage did
    assert repro_watch.finish(client, parent, settle_s=5, poll_s=0.05) == "KILLED"
    assert client.get_run(parent).info.status == "KILLED"


def test_waits_for_a_stage_still_closing_its_run(client):
    parent, child = repro_with_stage(client, None)  # the stage's run is still RUNNING
    start = time.monotonic()
    repro_watch.finish(client, parent, settle_s=0.5, poll_s=0.05)
    assert time.monotonic() - start >= 0.5  # waited (bounded) before ending the repro run
    assert client.get_run(parent).info.status == "FINISHED"
