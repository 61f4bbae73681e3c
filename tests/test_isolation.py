"""What one test leaves in the process does not reach the next (tests/conftest.py's autouse
fixtures): with `-n auto --dist loadfile` any two files may share a worker, in any order."""

from __future__ import annotations

import os


def test_a_test_that_sets_an_mlflow_experiment(tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("left-behind")
    assert os.environ.get("MLFLOW_EXPERIMENT_ID")


def test_the_next_test_starts_with_no_experiment_and_the_environment_it_had(tmp_path):
    """Else its start_run looks for the earlier store's experiment in its own store ("No
    Experiment with id=1 exists", as test_init_from failed in CI)."""
    import mlflow
    from mlflow.tracking import fluent

    assert fluent._active_experiment_id is None
    assert "MLFLOW_EXPERIMENT_ID" not in os.environ
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with mlflow.start_run() as run:  # the store's default experiment
        assert run.info.experiment_id == "0"
