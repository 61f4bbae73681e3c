"""promote: move the registry alias `champion` to the `candidate` version when its BLEU is higher.

    python -m src.promote                         # nmt-en-zh in the tracking store in use
    python -m src.promote --name nmt-en-vi --dry-run

Each export registers a version of `nmt-<src>-<tgt>` and points `candidate` at it; the BLEU
compared is the one export measured on the test split with the ONNX model (`fp32_bleu` of the
version's run). Scores are comparable only when both versions were tested on the same split.
Serve whichever alias you trust: `mlflow models serve -m models:/nmt-en-zh@champion`.
"""

from __future__ import annotations

import typer

from src.core import tracking
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.runtime.serving import CANDIDATE

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
CHAMPION = "champion"


def version_by_alias(client, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def score(client, version, metric: str) -> float:
    value = client.get_run(version.run_id).data.metrics.get(metric) if version.run_id else None
    if value is None:
        raise PipelineError(f"version {version.version} has no metric {metric!r} in its run")
    return float(value)


def should_promote(candidate: str, champion: str | None, new: float, old: float | None) -> bool:
    """Promote when there is no champion, or the candidate is another version that scores
    strictly higher (a tie keeps the champion: a new version must earn the move). `old` is the
    champion's score (None only without a champion)."""
    if champion is None:
        return True
    return champion != candidate and new > old


@app.command()
def main(
    name: str = typer.Option("nmt-en-zh", help="Registered model name."),
    metric: str = typer.Option("fp32_bleu", help="Run metric to compare (higher is better)."),
    dry_run: bool = typer.Option(False, help="Say what would happen, change nothing."),
) -> None:
    """Point `champion` at `candidate` if the candidate scores higher (or there is none)."""
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking.tracking_uri())
    client = MlflowClient()
    candidate = version_by_alias(client, name, CANDIDATE)
    if candidate is None:
        raise PipelineError(f"no version of {name} has the alias {CANDIDATE!r} in "
                            f"{tracking.tracking_uri()}: run `dvc repro export` with tracking on")
    champion = version_by_alias(client, name, CHAMPION)
    if champion is not None and champion.version == candidate.version:
        print(f"promote: version {candidate.version} is already the champion")
        return
    new = score(client, candidate, metric)
    old = score(client, champion, metric) if champion is not None else None
    if not should_promote(str(candidate.version),
                          None if champion is None else str(champion.version), new, old):
        print(f"promote: kept champion version {champion.version} ({metric} {old:.2f}); "
              f"candidate version {candidate.version} has {new:.2f}")
        return
    against = f" over version {champion.version} ({old:.2f})" if champion is not None else ""
    if dry_run:
        print(f"promote: would promote version {candidate.version} ({metric} {new:.2f}){against}")
        return
    client.set_registered_model_alias(name, CHAMPION, candidate.version)
    print(f"promote: version {candidate.version} ({metric} {new:.2f}) is the champion{against}")


if __name__ == "__main__":
    run_cli(app)
