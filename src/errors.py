"""One error type for problems a user can fix, and the CLI seam that prints them as one line.

Stages raise `PipelineError("what is wrong and what to do")`; `run_cli` turns it (and a few
well-known failures) into a single line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import sys

import typer


class PipelineError(Exception):
    """A failure caused by input, configuration or environment, explained in one line."""


def run_cli(app: typer.Typer) -> None:
    """Run a Typer app; user-facing failures end with `error: …` and exit 1."""
    try:
        app(standalone_mode=False)
    except PipelineError as exc:
        _die(str(exc))
    except KeyboardInterrupt:
        _die("interrupted")
    except typer.Exit as exc:  # --help and explicit exits
        sys.exit(exc.exit_code)
    except (typer.BadParameter, typer.Abort) as exc:
        _die(str(exc))
    except Exception as exc:  # click usage errors carry their own formatting
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


def _die(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def require_file(path, produced_by: str) -> None:
    """Fail clearly when an upstream output is missing (e.g. a stage run out of order)."""
    from pathlib import Path

    if not Path(path).exists():
        raise PipelineError(
            f"missing input {path}: run the '{produced_by}' stage first (dvc repro)"
        )
