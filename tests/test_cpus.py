"""How many CPUs a stage's thread pools get: the ones the process may run on."""

from __future__ import annotations

import os

import pytest
from helpers import python_snippet


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks here")
def test_thread_pools_are_sized_by_the_cpus_the_process_may_use():
    """Under `taskset -c 0` (or a container's CPU set) a stage opens one thread, not one per
    CPU of the machine: more would take turns on the one CPU it has."""
    probe = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
             "from src.core.cpus import usable_cpus; from src.runtime import sessions; "
             "print(usable_cpus(), sessions.DEFAULT_THREADS)")
    done = python_snippet(probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]
