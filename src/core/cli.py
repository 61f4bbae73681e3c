"""The CLI seam of every command: `run_cli` runs a Typer app and turns a `PipelineError`, usage
errors, OS errors (disk full, permissions) and even unexpected exceptions into a single
`error: …` line on stderr, never a traceback. Exit codes: 0 ok, 1 failure, 2 bad command line,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM). `NMT_DEBUG=1` re-raises, for developers who
want the traceback.

SIGTERM (`kill`, a scheduler, a CI timeout, `docker stop`) would end Python without running
`finally:` blocks, leaving the stage's MLflow run RUNNING forever; `run_cli` turns it into
`Terminated`, a KeyboardInterrupt, so it unwinds as Ctrl-C does.

Usage errors are recognised by shape (`format_message` + `exit_code`), not by class: typer up
to 0.2x raises click's exceptions, typer 0.29 raises those of its own vendored click, and a
class check against one of them silently misses the other.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import tempfile
import threading
import traceback
from contextlib import contextmanager

import typer

from src.core.errors import PipelineError, one_line

# On its way out CPython makes one last pass of the garbage collector over every object it
# tracks: with torch, MLflow and datasets loaded, about a second of each command's exit, to free
# memory the OS takes back anyway. Registered when this module loads, so it runs after the exit
# hooks registered later (MLflow's, which end its runs): what is left then is frozen, out of
# that pass. Our files are closed and runs ended by then; nothing waits on a finalizer.
atexit.register(gc.freeze)


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM: the user's or a scheduler's stop, handled like Ctrl-C."""


# The stops a user or scheduler sends, their message and exit code (128 + signal number).
STOPS = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated (SIGTERM)", 143)}
_stopped_by: list[int] = []


def stop_as_if(signum: int, why: str) -> None:
    """Stop as if `signum` had arrived (same unwinding, message and exit code), saying why."""
    print(f"stopping: {why}", file=sys.stderr)
    _stop(signum, None)


def _stop(signum, frame) -> None:
    """Unwind from wherever the process is (`finally:` blocks run), remembering why: typer
    turns a KeyboardInterrupt into a bare exit code 130 (0.29) or Abort (0.12) on its way out."""
    _stopped_by.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def stops_deferred(doing: str = ""):
    """Hold a Ctrl-C or SIGTERM that arrives inside the block until the block is done, then act
    on it: for work that must not be cut in half. MLflow's SQL store, stopped inside a write,
    keeps its SQLite write lock, and every later call (ending the runs) failed "database is
    locked", leaving them RUNNING forever. A second stop inside the block acts at once, so a
    hung tracking server cannot make a stop wait; `doing` names the work, to say so."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python delivers signals to the main thread only
        return
    held: list[int] = []

    def hold(signum, frame) -> None:
        if held:
            _stop(signum, frame)
        held.append(signum)
        if doing:
            print(f"stopping once {doing} is done (stop again to stop at once)", file=sys.stderr)

    previous = {signum: signal.signal(signum, hold) for signum in STOPS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            handler = previous[held[0]]
            if callable(handler):
                handler(held[0], None)
            elif handler == signal.SIG_DFL:  # outside run_cli: die as asked
                os.kill(os.getpid(), held[0])


def _is_usage_error(exc: BaseException) -> bool:
    return callable(getattr(exc, "format_message", None)) and isinstance(
        getattr(exc, "exit_code", None), int
    )


def _is_exit(exc: BaseException) -> bool:
    """typer.Exit / click.exceptions.Exit (`--help`, explicit exits), whichever click is in use."""
    return type(exc).__name__ == "Exit" and isinstance(getattr(exc, "exit_code", None), int)


def _save_traceback() -> str:
    fd, path = tempfile.mkstemp(prefix="nmt-traceback-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        traceback.print_exc(file=fh)
    return path


def run_cli(app: typer.Typer) -> None:
    """Run a Typer app; every failure ends with one `error: …` line and a non-zero exit."""
    for signum in STOPS:
        signal.signal(signum, _stop)
    if os.environ.get("NMT_DEBUG") == "1":
        app()
        return
    try:
        try:
            code = app(standalone_mode=False)  # an explicit typer.Exit(code) returns its code
        finally:
            if _stopped_by:  # typer 0.29 returns 130 for either stop, 0.12 raises Abort
                _die(*STOPS[_stopped_by[0]])
        # The work is done and recorded: a stop from here on (during MLflow's exit hooks) ends
        # the process the ordinary way, not with a traceback from inside an atexit callback
        # under exit code 0.
        for signum in STOPS:
            signal.signal(signum, signal.SIG_DFL)
    except PipelineError as exc:
        _die(str(exc))
    except KeyboardInterrupt:
        _die("interrupted", 130)
    except typer.Abort:
        _die("aborted")
    except BrokenPipeError:  # `… | head`: the reader left; not an error worth a message
        sys.stderr.close()
        os._exit(1)
    except Exception as exc:
        if _is_exit(exc):
            sys.exit(exc.exit_code)
        if _is_usage_error(exc):  # bad option, missing or extra argument, bad option value
            _die(f"{one_line(exc.format_message())} (see --help)", exc.exit_code)
        if isinstance(exc, MemoryError):
            _die("out of memory")
        if isinstance(exc, OSError) and exc.strerror:
            where = f": {exc.filename}" if exc.filename else ""
            _die(f"{exc.strerror}{where}")
        path = _save_traceback()
        _die(f"unexpected {type(exc).__name__}: {one_line(exc)[:300]} "
             f"(a bug; traceback saved to {path}, NMT_DEBUG=1 shows it)")
    if isinstance(code, int) and code:
        sys.exit(code)


def _die(message: str, code: int = 1) -> None:
    print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(code)
