"""How many CPUs this process may run on: the ones its affinity mask allows (`taskset`, a
container's or a batch scheduler's CPU set), which every thread pool a stage opens is sized by;
the machine's count (`os.cpu_count`) would oversubscribe the CPUs it was given."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity masks (macOS, Windows): the machine's count
        return os.cpu_count() or 1
