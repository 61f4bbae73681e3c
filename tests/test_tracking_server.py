"""A tracking server that goes away mid-run never stops a stage: one warning, training goes on,
and the stage's own files keep every result."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from src.core import tracking
from src.core.atomic import write_json
from src.core.local_servers import mlflow_server

pytestmark = pytest.mark.slow


def test_a_tracking_server_going_away_mid_run_does_not_stop_the_stage(
    tmp_path, monkeypatch, capsys
):
    import mlflow

    monkeypatch.setenv("NMT_TRACKING", "on")
    monkeypatch.setenv("NMT_EXPERIMENT", "nmt")
    monkeypatch.setattr(tracking, "_warned", set())
    with mlflow_server(tmp_path / "server") as (uri, stop_server):
        # the server alone, without MLflow's job runner and its consumers (eight processes
        # and about 22 CPU-seconds at every start, for GenAI jobs nothing here runs)
        assert not [p for p in psutil.Process().children(recursive=True)
                    if "mlflow.server.jobs" in " ".join(p.cmdline())]
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with tracking.stage_run("train", {"train": {"lr": 0.001}}) as run:
            assert isinstance(run, tracking.MlflowRun)
            run.log_metrics({"train_loss": 3.0}, step=1)
            logged = mlflow.MlflowClient(uri).get_metric_history(run.run_id, "train_loss")
            assert [m.value for m in logged] == [3.0]
            stop_server()
            start = time.monotonic()
            for step in range(2, 200):  # a training loop logging every step
                run.log_metrics({"train_loss": 3.0 / step}, step=step)
            # and the stage writes its outputs, as train writes model.pt and its reports
            write_json(tmp_path / "train_stats.json", {"steps": step})
        # leaving the block ends the stage's run and its repro run, against the dead server
        elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert err.count("warning: MLflow log_metrics failed") == 1, err
    assert elapsed < 30, f"{elapsed:.1f} s spent on a dead server"  # not minutes of retries
    assert json.loads((tmp_path / "train_stats.json").read_text()) == {"steps": 199}
