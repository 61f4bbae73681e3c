"""The process's memory allocator: tcmalloc where the machine has it, else glibc tuned to keep
freed memory.

A training step allocates and frees thousands of tensors of ever-changing sizes (a batch's
shape is new almost every step). glibc's malloc fragments under that load: in one process of
bf16 steps on an AMX Xeon, tokens/s fell from ~10,300 to ~8,500 over 450 steps while
`aten::empty` and friends doubled their time and the heap grew to 5 GB; fp32 did not decline.
With tcmalloc preloaded (gperftools' `libtcmalloc_minimal`) the same steps held ~11,500
throughout at 1.5 GB, and the train stage ran 29% more bf16 tokens/s, 5% more fp32
(docs/training_speed.md). An allocator can only be chosen when a process starts
(`LD_PRELOAD`), so `use_allocator` starts the process again on it: same pid, arguments and
environment, plus the preload. The allocator changes no arithmetic: the steps' numbers are the
same bits.

Without tcmalloc, glibc is told to keep freed memory (`keep_freed_memory`): it serves an
allocation above its mmap threshold with a fresh `mmap` and returns it to the kernel on free, so
each step paid the kernel to zero its tens of MB of logits and gradients again (a freshly mapped
41 MB buffer took ~4x as long to write as a reused one).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import PipelineError

M_TRIM_THRESHOLD = -1  # glibc mallopt() parameters (malloc.h)
M_MMAP_MAX = -4

TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
# Shared libraries that replace malloc when preloaded, as they appear in /proc/self/maps.
ALLOCATOR_LIBRARIES = {"libtcmalloc": "tcmalloc", "libjemalloc": "jemalloc",
                       "libmimalloc": "mimalloc"}
ALLOCATOR_CHOICES = ("auto", "tcmalloc", "system")  # train.allocator
RESTARTED = "NMT_ALLOCATOR_RESTARTED"  # set on the restart: never restart twice
INSTALL_HINT = ("Debian/Ubuntu: apt-get install libtcmalloc-minimal4; Fedora: dnf install "
                "gperftools-libs; conda: conda install gperftools")


@dataclass(frozen=True)
class Allocator:
    name: str  # "tcmalloc", "jemalloc", "mimalloc" or "glibc"
    library: str = ""  # the preloaded library's path; "" for the C library's own malloc
    note: str = ""  # a line for the user when the choice was not what `auto` hopes for


def library_dirs() -> list[Path]:
    """Where distributions and environments put shared libraries, most specific first."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [Path(sys.prefix) / "lib"]
    if os.environ.get("CONDA_PREFIX"):
        dirs.append(Path(os.environ["CONDA_PREFIX"]) / "lib")
    for root in ("/usr/local/lib", "/usr/lib", "/lib"):
        if multiarch:
            dirs.append(Path(root) / multiarch)
        dirs.append(Path(root))
    dirs += [Path("/usr/lib64"), Path("/lib64")]
    return dirs


def find_tcmalloc(dirs: list[Path] | None = None) -> Path | None:
    """The first tcmalloc library in `dirs` (default: `library_dirs()`), or None."""
    for directory in library_dirs() if dirs is None else dirs:
        for name in TCMALLOC_NAMES:
            if (directory / name).is_file():
                return directory / name
    return None


def preloaded_allocator(maps: Path = Path("/proc/self/maps")) -> Allocator | None:
    """The malloc-replacing library mapped into this process, if any (Linux only)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [pathname]
        path = fields[5] if len(fields) == 6 else ""
        stem = Path(path).name
        for prefix, name in ALLOCATOR_LIBRARIES.items():
            if stem.startswith(prefix):
                return Allocator(name, path)
    return None


def use_allocator(choice: str, restart_argv: list[str] | None) -> Allocator:
    """Run this process on the allocator `train.allocator` asks for and say which it runs on.

    `choice`: "auto" (tcmalloc where found, else glibc), "tcmalloc" (an error where not found)
    or "system" (whatever the process started with). With tcmalloc wanted, found and not yet
    loaded, the process is replaced (`os.execve`) by `restart_argv` run with tcmalloc preloaded,
    and this call does not return; `restart_argv` None (a caller inside a test runner, say)
    never restarts, and reports what the process has.
    """
    if choice not in ALLOCATOR_CHOICES:
        raise ValueError(f"allocator {choice!r}: expected one of {ALLOCATOR_CHOICES}")
    loaded = preloaded_allocator()
    if loaded and loaded.name != "tcmalloc" and choice == "tcmalloc":
        raise PipelineError(f"train.allocator tcmalloc: this process runs on {loaded.name} "
                            f"({loaded.library}, from LD_PRELOAD); drop it from LD_PRELOAD or "
                            "set train.allocator: system")
    if loaded or choice == "system":
        if not loaded:
            keep_freed_memory()
        return loaded or Allocator(own_malloc())
    if not sys.platform.startswith("linux"):
        if choice == "tcmalloc":
            raise PipelineError("train.allocator tcmalloc: preloading an allocator is done on "
                                "Linux only; set train.allocator: auto")
        return Allocator(own_malloc())
    if os.environ.get(RESTARTED):  # restarted with the preload, yet the library is not mapped
        return refuse_or_fall_back(choice, f"{os.environ[RESTARTED]} did not load "
                                   "(LD_PRELOAD); see the dynamic loader's message above")
    library = find_tcmalloc()
    if library is None:
        return refuse_or_fall_back(choice, "no tcmalloc library found (" + INSTALL_HINT + ")")
    if restart_argv is None:
        return refuse_or_fall_back(choice, "this process cannot be restarted with "
                                   f"{library} preloaded")
    preload = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD", "")]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, restart_argv,
              os.environ | {"LD_PRELOAD": preload, RESTARTED: str(library)})
    raise AssertionError("unreachable: os.execve returned")  # pragma: no cover


def refuse_or_fall_back(choice: str, why: str) -> Allocator:
    if choice == "tcmalloc":
        raise PipelineError(f"train.allocator tcmalloc: {why}; or set train.allocator: auto")
    keep_freed_memory()
    name = own_malloc()
    return Allocator(name, note=f"memory allocator: {name} malloc, as {why}; bf16 steps ran "
                     "29% faster on tcmalloc on an AMX Xeon (docs/training_speed.md)")


def allocator_in_use() -> str:
    """The name of the allocator this process runs on ("tcmalloc", "glibc", ...)."""
    loaded = preloaded_allocator()
    return loaded.name if loaded else own_malloc()


def own_malloc() -> str:
    """"glibc" where the C library is glibc, else "system"."""
    import platform

    return "glibc" if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" \
        else "system"


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to reuse freed memory instead of unmapping it. False where the C
    library is not glibc (macOS, musl) or another allocator replaced its malloc: nothing
    changes there."""
    if not sys.platform.startswith("linux") or preloaded_allocator():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
