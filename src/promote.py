"""promote: move the registry alias `champion` to the `candidate` version by a two-part rule.

    python -m src.promote                         # nmt-en-zh in the tracking store in use
    python -m src.promote --name nmt-en-vi --dry-run --margin 1

Each export registers a version of `nmt-<src>-<tgt>` and points `candidate` at it. The candidate
becomes the champion when there is none, or when both hold:

1. it is better on the new data: a strictly higher `--metric` (default `fp32_bleu`, the BLEU
   export measured on the test split with the ONNX model);
2. it did not forget: on each named test set both versions were scored on (evaluate's
   `download.test_sets`, kept as `eval.test_sets.<name>.bleu`; `--old-sets` picks some), its
   BLEU is at most `--margin` below the champion's.

It says which rule decided, with the numbers. Scores are comparable only when both versions
were tested on the same sentences. `--dry-run` changes nothing and also prints the candidate's
lineage (the versions it was trained from). Serve whichever alias you trust:
`mlflow models serve -m models:/nmt-en-zh@champion`.
"""

from __future__ import annotations

import typer

from src.core import registry, tracking
from src.core.cli import run_cli
from src.core.errors import PipelineError

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


OLD_SET = "eval.test_sets.{}.bleu"  # evaluate's score of a named set, kept by export


def old_set_scores(client, version) -> dict[str, float]:
    """BLEU on each named test set the version was scored on, by set name."""
    metrics = client.get_run(version.run_id).data.metrics if version.run_id else {}
    prefix, suffix = OLD_SET.split("{}")
    return {k.removeprefix(prefix).removesuffix(suffix): float(v) for k, v in metrics.items()
            if k.startswith(prefix) and k.endswith(suffix)}


def should_promote(candidate: str, champion: str | None, new: float, old: float | None,
                   sets: dict[str, tuple[float, float]] | None = None, margin: float = 0.5,
                   metric: str = "fp32_bleu") -> tuple[bool, str]:
    """(promote?, the rule that decided, with its numbers). `new`/`old`: the candidate's and
    the champion's `metric` (old None only without a champion); `sets`: per old test set,
    (candidate's, champion's) BLEU. A tie on the metric keeps the champion: a new version must
    earn the move."""
    if champion is None:
        return True, "no champion yet"
    if champion == candidate:
        return False, "it is the champion already"
    if new <= old:
        return False, (f"rule 1 (better on the new test split) failed: {metric} {new:.2f} vs "
                       f"the champion's {old:.2f}")
    for name, (mine, theirs) in sorted((sets or {}).items()):
        if mine < theirs - margin:
            return False, (f"rule 2 (at most {margin:g} BLEU below the champion on each old test "
                           f"set) failed on {name}: {mine:.2f} vs {theirs:.2f}")
    kept = ", ".join(f"{n} {a:.2f} vs {b:.2f}" for n, (a, b) in sorted((sets or {}).items()))
    return True, (f"rule 1 held ({metric} {new:.2f} vs {old:.2f}) and rule 2 held "
                  + (f"({kept}, margin {margin:g})" if kept else "(no old test set in common)"))


def lineage_line(client, name: str, version: str) -> str:
    chain = registry.lineage(client, name, version)
    steps = [f"{v.name if v.name != name else ''} version {v.version}".strip() for v in chain]
    return "lineage: " + " <- ".join(steps) if len(chain) > 1 else \
        f"lineage: version {version} was trained from random weights"


@app.command()
def main(
    name: str = typer.Option("nmt-en-zh", help="Registered model name."),
    metric: str = typer.Option("fp32_bleu", help="Run metric of rule 1 (higher is better)."),
    margin: float = typer.Option(0.5, min=0, help="Rule 2: BLEU the candidate may lose against "
                                 "the champion on each old test set."),
    old_sets: str = typer.Option("", help="Rule 2's sets, comma-separated (default: every "
                                 "named test set both versions were scored on)."),
    dry_run: bool = typer.Option(False, help="Say what would happen and print the candidate's "
                                 "lineage; change nothing."),
) -> None:
    """Point `champion` at `candidate` if it is better on the new test split and at most
    --margin worse on each old test set (or there is no champion)."""
    # Imported here: serving imports mlflow.pyfunc (seconds), and `--help` should answer at once.
    from src.runtime.serving import CANDIDATE

    client = registry.open_client()
    candidate = version_by_alias(client, name, CANDIDATE)
    if candidate is None:
        raise PipelineError(f"no version of {name} has the alias {CANDIDATE!r} in "
                            f"{tracking.tracking_uri()}: run `dvc repro export` with tracking on")
    if dry_run:
        print(lineage_line(client, name, str(candidate.version)))
    champion = version_by_alias(client, name, CHAMPION)
    if champion is not None and champion.version == candidate.version:
        print(f"promote: version {candidate.version} is already the champion")
        return
    new = score(client, candidate, metric)
    old = score(client, champion, metric) if champion is not None else None
    sets = {}
    if champion is not None:
        mine, theirs = old_set_scores(client, candidate), old_set_scores(client, champion)
        wanted = [s.strip() for s in old_sets.split(",") if s.strip()] or sorted(mine.keys()
                                                                               & theirs.keys())
        missing = [s for s in wanted if s not in mine or s not in theirs]
        if missing:
            raise PipelineError(f"old test set {missing[0]!r} was not scored on both versions "
                                f"(candidate: {sorted(mine) or 'none'}, champion: "
                                f"{sorted(theirs) or 'none'})")
        sets = {s: (mine[s], theirs[s]) for s in wanted}
    promoted, why = should_promote(str(candidate.version),
                                   None if champion is None else str(champion.version), new, old,
                                   sets, margin, metric)
    if not promoted:
        print(f"promote: kept champion version {champion.version}; candidate version "
              f"{candidate.version}: {why}")
        return
    against = f" over version {champion.version}" if champion is not None else ""
    if dry_run:
        print(f"promote: would promote version {candidate.version}{against}: {why}")
        return
    client.set_registered_model_alias(name, CHAMPION, candidate.version)
    print(f"promote: version {candidate.version} is the champion{against}: {why}")


if __name__ == "__main__":
    run_cli(app)
