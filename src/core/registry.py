"""The MLflow model registry as training and promotion read it: model URIs, a version by alias
or number, the PyTorch weights a version was exported from, and its lineage.

Export logs models/model.pt and models/tokenizer/ under `weights/` in the run that registers
each version, so a version can be trained further (train.init_from: models:/<name>@<alias>).
A version trained from another carries the tags `parent_name`, `parent_version` and
`parent_sha256`, and says so in its description.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from src.core import tracking
from src.core.errors import PipelineError
from src.core.params import MODEL_URI

WEIGHTS_ARTIFACT = "weights"  # model.pt and tokenizer/ in the registering run


@dataclass(frozen=True)
class ModelRef:
    name: str
    alias: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        return f"models:/{self.name}@{self.alias}" if self.alias else \
            f"models:/{self.name}/{self.version}"


def parse_model_uri(uri: str) -> ModelRef:
    match = MODEL_URI.fullmatch(uri.strip())
    if match is None:
        raise ValueError(f"{uri!r} is not a registered model: write models:/<name>@<alias> or "
                         "models:/<name>/<version>")
    return ModelRef(match["name"], match["alias"], match["version"])


def open_client():
    """An MlflowClient on the project's tracking store (tracking.tracking_uri())."""
    import mlflow
    from mlflow import MlflowClient

    tracking.apply_mlflow_defaults()
    mlflow.set_tracking_uri(tracking.tracking_uri())
    return MlflowClient()


def _unreachable(exc: Exception) -> PipelineError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return PipelineError(f"the tracking store {tracking.tracking_uri()} could not be read: "
                         f"{first}")


def find_version(client, ref: ModelRef):
    """The ModelVersion `ref` names; one line when the name, alias or number does not exist or
    the store cannot be read."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(ref.name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise PipelineError(f"no registered model {ref.name!r} in "
                                f"{tracking.tracking_uri()}") from None
        raise _unreachable(exc) from None
    except Exception as exc:  # connection refused, timeouts, a broken store
        raise _unreachable(exc) from None
    try:
        if ref.alias:
            return client.get_model_version_by_alias(ref.name, ref.alias)
        return client.get_model_version(ref.name, ref.version)
    except MlflowException as exc:
        if exc.error_code in {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}:
            what = f"alias {ref.alias!r}" if ref.alias else f"version {ref.version}"
            raise PipelineError(f"{ref.name} has no {what} in {tracking.tracking_uri()}"
                                ) from None
        raise _unreachable(exc) from None
    except Exception as exc:
        raise _unreachable(exc) from None


def download_weights(client, ref: ModelRef, version, dest: Path) -> Path:
    """The `weights/` folder (model.pt, tokenizer/) of the version's run, under `dest`."""
    try:
        names = {Path(f.path).name for f in client.list_artifacts(version.run_id,
                                                                 WEIGHTS_ARTIFACT)}
    except Exception as exc:
        raise _unreachable(exc) from None
    if not {"model.pt", "tokenizer"} <= names:
        raise PipelineError(f"version {version.version} of {ref.name} has no PyTorch weights in "
                            f"its run (exported before versions carried them): set "
                            f"train.init_from to the model.pt it was exported from")
    try:
        return Path(client.download_artifacts(version.run_id, WEIGHTS_ARTIFACT, str(dest)))
    except Exception as exc:
        raise _unreachable(exc) from None


def lineage(client, name: str, version: str, limit: int = 20) -> list:
    """The version, its parent, the parent's parent... (ModelVersion objects, newest first),
    following the `parent_*` tags while they name a version of a registered model."""
    from mlflow.exceptions import MlflowException

    chain = []
    while version and len(chain) < limit:
        try:
            current = client.get_model_version(name, version)
        except MlflowException:
            break
        chain.append(current)
        name, version = (current.tags.get("parent_name") or name,
                         current.tags.get("parent_version"))
    return chain
