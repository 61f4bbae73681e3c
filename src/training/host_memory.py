"""Keep freed memory in the process, so a training step does not page-fault its buffers back in.

glibc serves an allocation above its mmap threshold (128 KiB, rising to at most 32 MiB) with a
fresh `mmap` and returns it to the kernel on free. A training step allocates and frees the same
large activations every step (the (tokens, vocabulary) logits and their gradient are tens of MB),
so each step paid the kernel to zero those pages again: writing a freshly mapped 41 MB buffer took
~4x as long as writing a reused one. Turning mmap off for the heap and never trimming it makes
freed blocks reusable; the price is that the process keeps its peak memory until it exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc mallopt() parameters (malloc.h)
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to reuse freed memory instead of unmapping it. False where the C
    library is not glibc (macOS, musl): nothing changes there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
