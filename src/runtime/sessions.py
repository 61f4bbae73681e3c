"""Opening ONNX Runtime sessions of our files: the providers `placement` picks for a file's
kind, the onnxruntime-extensions library for text models, and the two cuts of a file that
search faster on the CPU (the file without its BeamSearch operator for batches, the operator
alone for one sentence). Also the tokenizer fingerprints export records and loading checks.
No torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import mmap
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from src.core.cpus import usable_cpus
from src.core.errors import PipelineError
from src.runtime import batch_graph, operator_graph, placement
from src.runtime.placement import CUDA

# Two: on the 2-core machines of docs/engines.md ours is fastest on two threads in every cell of
# the best-thread tables but one (int8 beam 4 batch 1, one sitting); the fused attention nodes
# split (batch x heads) over the threads. One where the process may run on one CPU only: a
# second thread would only wait its turn on it.
DEFAULT_THREADS = min(2, usable_cpus())


def warn_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def extensions_library() -> str | None:
    """The onnxruntime-extensions operator library (SentencePiece ops of text models), found
    without importing the package: its `__init__` imports torch whenever torch is installed
    (1.8-2.2 s and ~250 MB), and a process with torch in it slows other engines too."""
    import importlib.machinery
    import importlib.util

    try:
        spec = importlib.util.find_spec("onnxruntime_extensions")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            library = Path(folder) / f"_extensions_pydll{suffix}"
            if library.is_file():
                return str(library)
    return None


@functools.cache
def load_cuda_libraries() -> None:
    """Once per process, before the first session that asks for CUDA. The CUDA provider of
    onnxruntime-gpu links libcudart, libcublas, libcurand (and opens cuDNN) by name with no
    search path of its own: where they came as pip packages (`onnxruntime-gpu[cuda,cudnn]`, or
    torch's), a process that has not imported torch finds them only if something loads them
    first, and would quietly run on the CPU. ONNX Runtime's `preload_dlls` (1.21 and later)
    loads them from those packages or the default paths; what it prints on the way is dropped,
    since a CUDA provider that still cannot start is reported by `open_session` in one line."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
        preload()


@contextmanager
def native_stderr_filtered(noise: tuple[str, ...] = ("precompiled_charsmap is empty",)):
    """Drop known INFO lines that native code (SentencePiece inside onnxruntime-extensions)
    writes straight to file descriptor 2 while a session loads; pass the rest through."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(text in line for text in noise):
                    sys.stderr.write(line)


def open_session(model_path: Path, choice: str = "auto", threads: int = DEFAULT_THREADS,
                 warn: Callable[[str], None] | None = None, edited: Path | None = None):
    """A session of one of our files on the providers `placement` chooses for its kind, with
    node assignments recorded (`placement.describe`); of `edited` (a copy of the file with
    changes) instead of the file itself when given."""
    import onnxruntime as ort

    model_path = Path(model_path)
    if not model_path.is_file():
        raise PipelineError(f"model not found: {model_path} (run `dvc repro export`)")
    try:
        kind = placement.FileKind.of(placement.read_metadata(model_path))
    except PipelineError:  # not readable as ONNX: let ONNX Runtime say what is wrong
        kind = placement.FileKind.of({})
    wanted = placement.providers_for(choice, kind, ort.get_available_providers())
    # Where CUDA cannot start, ORT logs errors before falling back; we say it in one line.
    severity = 4 if CUDA in wanted else 3
    ort.set_default_logger_severity(severity)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = severity
    options.add_session_config_entry(placement.RECORD_ASSIGNMENTS, "1")
    if CUDA in wanted:
        load_cuda_libraries()
    # only text models use its operators: others never load it
    library = extensions_library() if kind.text else None
    if library is not None:
        options.register_custom_ops_library(library)
    try:
        with native_stderr_filtered():
            session = ort.InferenceSession(str(edited or model_path), options,
                                           providers=wanted)
    except Exception as exc:  # onnxruntime raises its own types for bad protobufs and graphs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "ai.onnx.contrib" in str(exc) and extensions_library() is None:
            first = "it is a text model and needs `pip install onnxruntime-extensions`"
        raise PipelineError(f"cannot load model {model_path}: {first}") from None
    if CUDA in wanted and session.get_providers()[0] != CUDA:
        if choice == "cuda" or kind.weights == "fp16":
            raise PipelineError("provider cuda: ONNX Runtime could not start CUDA "
                                "(check the CUDA/cuDNN libraries; use cpu)")
    if choice == "cuda" and (kind.weights == "int8" or kind.text):
        warning = placement.fallback_warning(session, model_path.name)
        if warning:
            (warn or warn_stderr)(warning)
    return session


def open_batch_session(model_path: Path, choice: str, threads: int,
                       warn: Callable[[str], None] | None = None):
    """A session of the file without the BeamSearch operator beside its Loops, for batches
    (src/runtime/batch_graph.py); None for a file whose batches that operator searches."""
    return _open_cut(model_path, choice, threads, warn, batch_graph.pieces_without_operator,
                     ("batches go", "its batch search"))


def open_operator_session(model_path: Path, choice: str, threads: int,
                          warn: Callable[[str], None] | None = None):
    """A session of the file as its BeamSearch operator alone, each subgraph holding its
    weights, for one sentence and n-best lists (src/runtime/operator_graph.py); None for a
    file that is not so written, where the providers are not the CPU's alone, or where the
    temporary directory has no room (then the file's own session searches, slower)."""
    import onnxruntime as ort

    try:
        kind = placement.FileKind.of(placement.read_metadata(model_path))
        providers = placement.providers_for(choice, kind, ort.get_available_providers())
    except (PipelineError, OSError, ValueError):  # missing, unreadable, or no provider for
        return None  # it: opening the file itself says so, in one line
    if providers != [placement.CPU] or kind.text:  # measured on the CPU only (docs/engines.md);
        return None  # a text twin's search sits between its tokenizer nodes: never cut
    try:
        return _open_cut(model_path, choice, threads, warn, operator_graph.pieces_operator_only,
                         ("one sentence goes", "its search alone"))
    # unreadable, empty or malformed, or the cut refused: the file's own session says what
    # is wrong with the file, or searches as it always did
    except (OSError, ValueError, PipelineError):
        return None


def _open_cut(model_path: Path, choice: str, threads: int, warn: Callable[[str], None] | None,
              cut: Callable, names: tuple[str, str]):
    """A session of `cut`'s pieces of the mapped file (None: no cut for this file). They are
    written to a temporary file, a MiB at a time with `os.pread` (the copied pages never count
    in this process's memory), and opened by path: opened from bytes in memory, the session
    held about 110 MB more (docs/engines.md, what our files do). No room there: a warning
    naming `names` (what goes through the file as written instead, what had no room) and None."""
    with open(model_path, "rb") as fh, \
            mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        pieces = cut(mapped)
        if pieces is None:
            return None
        with tempfile.TemporaryDirectory(prefix="nmt-cut-", ignore_cleanup_errors=True) as tmp:
            edited = Path(tmp, Path(model_path).name)
            try:
                with edited.open("wb") as out:
                    batch_graph.write_pieces(mapped, pieces, out, source=fh.fileno())
            except OSError as exc:  # a full or read-only temp dir: slower, not wrong
                (warn or warn_stderr)(f"{names[0]} through {Path(model_path).name} as "
                                      f"written (no room for {names[1]}: {exc.strerror})")
                return None
            return open_session(model_path, choice, threads, warn, edited=edited)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tokenizer_fingerprint(tokenizer_dir: Path, side: str) -> str:
    """What export records as `<side>_tokenizer_sha256` and `load_translator` checks."""
    return sha256(Path(tokenizer_dir) / f"{side}.model")


def tokenizer_metadata(tokenizer_dir: Path) -> dict[str, str]:
    return {f"{side}_tokenizer_sha256": tokenizer_fingerprint(tokenizer_dir, side)
            for side in ("source", "target")}


