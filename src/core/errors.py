"""The error type for problems a user can fix, and the checks that raise it.

Stages raise `PipelineError("what is wrong and what to do")`; src/core/cli.py turns it into one
`error: …` line on stderr. This module imports nothing outside the standard library, so the
served model (src/runtime) can raise it without the CLI's dependencies.
"""

from __future__ import annotations

from pathlib import Path


class PipelineError(Exception):
    """A failure caused by input, configuration or environment, explained in one line."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def require_file(path, produced_by: str) -> None:
    """Fail clearly when an upstream output is missing (e.g. a stage run out of order)."""
    if not Path(path).exists():
        raise PipelineError(
            f"missing input {path}: run the '{produced_by}' stage first (dvc repro)"
        )
