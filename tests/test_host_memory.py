"""The train stage's memory allocator: tcmalloc found, preloaded by a restart, or glibc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import python_snippet

from src.core.errors import PipelineError
from src.training import host_memory
from src.training.host_memory import Allocator, find_tcmalloc, preloaded_allocator, use_allocator

ROOT = Path(__file__).resolve().parents[1]
LINUX = sys.platform.startswith("linux")


def test_tcmalloc_is_found_in_the_first_directory_that_has_it_minimal_build_first(tmp_path):
    empty, full_only, both = (tmp_path / name for name in ("empty", "full", "both"))
    for directory in (empty, full_only, both):
        directory.mkdir()
    (full_only / "libtcmalloc.so.4").write_bytes(b"")
    (both / "libtcmalloc.so.4").write_bytes(b"")
    (both / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_tcmalloc([empty]) is None
    assert find_tcmalloc([empty, both, full_only]) == both / "libtcmalloc_minimal.so.4"
    assert find_tcmalloc([full_only, both]) == full_only / "libtcmalloc.so.4"


def test_the_preloaded_allocator_is_read_from_the_process_memory_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234   /usr/bin/python3.11\n"
        "7f1c2c000000-7f1c2c021000 rw-p 00000000 00:00 0 \n"
        "7f1c30000000-7f1c30010000 r-xp 00000000 fd:01 99     "
        "/opt/my libs/libjemalloc.so.2\n")
    assert preloaded_allocator(maps) == Allocator("jemalloc", "/opt/my libs/libjemalloc.so.2")
    maps.write_text("7f1c2c000000-7f1c2c021000 rw-p 00000000 00:00 0\n"
                    "7f1c30000000-7f1c30010000 r-xp 00000000 fd:01 99 /usr/lib/libc.so.6\n")
    assert preloaded_allocator(maps) is None
    assert preloaded_allocator(tmp_path / "absent") is None


@pytest.fixture
def no_tcmalloc(monkeypatch, tmp_path):
    """A machine without tcmalloc, in a process that has not preloaded an allocator."""
    monkeypatch.setattr(host_memory, "library_dirs", lambda: [tmp_path])
    monkeypatch.setattr(host_memory, "preloaded_allocator", lambda maps=None: None)
    monkeypatch.delenv(host_memory.RESTARTED, raising=False)


@pytest.mark.skipif(not LINUX, reason="preloading is Linux's")
def test_asking_for_tcmalloc_where_there_is_none_is_one_line_saying_how_to_install_it(
        no_tcmalloc):
    with pytest.raises(PipelineError, match="train.allocator tcmalloc: no tcmalloc library "
                       "found .*apt-get install libtcmalloc-minimal4.*train.allocator: auto"):
        use_allocator("tcmalloc", [sys.executable, "-c", "pass"])


def test_a_process_on_another_preloaded_allocator_keeps_it_unless_tcmalloc_is_demanded(
        monkeypatch):
    jemalloc = Allocator("jemalloc", "/usr/lib/libjemalloc.so.2")
    monkeypatch.setattr(host_memory, "preloaded_allocator", lambda maps=None: jemalloc)
    assert use_allocator("auto", None) == jemalloc == use_allocator("system", None)
    with pytest.raises(PipelineError, match="runs on jemalloc .*LD_PRELOAD"):
        use_allocator("tcmalloc", None)


@pytest.mark.skipif(not LINUX, reason="preloading is Linux's")
def test_auto_without_tcmalloc_runs_on_the_c_library_and_says_why(no_tcmalloc):
    chosen = use_allocator("auto", [sys.executable, "-c", "pass"])
    assert chosen.name == host_memory.own_malloc() and chosen.library == ""
    assert "no tcmalloc library found" in chosen.note and "apt-get install" in chosen.note
    assert use_allocator("system", None) == Allocator(host_memory.own_malloc())
    with pytest.raises(ValueError, match="'fast': expected one of"):
        use_allocator("fast", None)


RESTARTING = """
import os, sys
from pathlib import Path
from src.training import host_memory
if len(sys.argv) > 2:  # a folder to look in instead of the machine's
    host_memory.library_dirs = lambda: [Path(sys.argv[2])]
print("started", sys.argv[1], flush=True)
chosen = host_memory.use_allocator(sys.argv[1], sys.orig_argv)
print("runs on", chosen.name, chosen.library, "|", chosen.note,
      "| keeps freed memory" if host_memory.keep_freed_memory() else "")
"""


def run_restarting(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in {"LD_PRELOAD", host_memory.RESTARTED}} | (env or {})
    return subprocess.run([sys.executable, "-c", RESTARTING, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not LINUX, reason="preloading is Linux's")
def test_a_library_that_fails_to_preload_is_not_retried_and_auto_falls_back(tmp_path):
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"not a shared object")
    done = run_restarting("auto", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["started auto", "started auto"]  # one restart, then no other
    assert lines[2].startswith(f"runs on {host_memory.own_malloc()}  | memory allocator:")
    assert "libtcmalloc_minimal.so.4 did not load" in lines[2]
    assert "keeps freed memory" in lines[2] or host_memory.own_malloc() != "glibc"
    failed = run_restarting("tcmalloc", str(tmp_path))
    assert failed.returncode != 0 and "did not load" in failed.stderr


@pytest.mark.skipif(not LINUX, reason="preloading is Linux's")
def test_the_process_restarts_once_on_tcmalloc_with_its_arguments():
    """Needs the machine's tcmalloc (`.ci/run` installs it and sets NMT_REQUIRE_TCMALLOC=1)."""
    library = find_tcmalloc()
    if library is None:
        if os.environ.get("NMT_REQUIRE_TCMALLOC") == "1":
            pytest.fail("no tcmalloc library, and NMT_REQUIRE_TCMALLOC=1")
        pytest.skip("no tcmalloc here (apt-get install libtcmalloc-minimal4)")
    done = run_restarting("auto", env={"LD_PRELOAD": ""})
    assert done.returncode == 0, done.stderr
    # tcmalloc replaced glibc's malloc, so glibc is not tuned; no note for the user
    assert done.stdout.splitlines() == ["started auto", "started auto",  # its arguments kept
                                        f"runs on tcmalloc {library.resolve()} |  "]
    assert run_restarting("system").stdout.splitlines()[1].startswith(
        f"runs on {host_memory.own_malloc()}  |")


def test_the_train_stage_chooses_its_allocator_before_importing_torch():
    """The restart onto tcmalloc replaces the process: whatever src.train imported before it
    is imported again, and torch alone takes about 1.5 s of each train stage's start."""
    probe = "import sys, src.train; print(sorted({'torch', 'mlflow'} & set(sys.modules)))"
    done = python_snippet(probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
