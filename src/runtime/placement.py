"""Which ONNX Runtime provider runs which of our files, and where its nodes actually ran.

The policy, per file (its metadata says which kind it is, read before any session opens):

* model.onnx (fp32) and its text twin's search: CUDA when it can work (onnxruntime-gpu and an
  NVIDIA device), else the CPU;
* model.int8.onnx: the CPU, even with a GPU. Its DynamicQuantizeLinear nodes have no CUDA kernel
  and CUDA's MatMulInteger takes int8 x int8 only (ours is uint8 x int8), so on CUDA those nodes
  fall back to the CPU inside the decoder that runs once per generated token, copying
  activations across the bus each step. `--provider cuda` still forces it, with a warning
  naming the nodes that fell back;
* text files (*.text.onnx): the CPU under `auto`. Their SentencePiece and string operators have
  CPU kernels only, and the Loop that turns ids into strings has not been run on CUDA;
  `--provider cuda` forces the search onto the GPU (the string operators stay on the CPU);
* model.fp16.onnx: CUDA only; refused elsewhere with one line. The CPU lacks float16 kernels
  for many of its nodes, which ONNX Runtime runs through casts it inserts: slower than
  model.onnx (docs/gpu.md; the tests run it so, to check its search without a GPU).

`describe` reports what ran, from ONNX Runtime's own record of node assignments
(`session.record_ep_graph_assignment_info`, onnxruntime >= 1.24), instead of the first
provider's name.
"""

from __future__ import annotations

import mmap
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import PipelineError
from src.runtime.proto_wire import fields

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
CHOICES = ("auto", "cuda", "cpu")
RECORD_ASSIGNMENTS = "session.record_ep_graph_assignment_info"
SHOWN_OPS = 4  # op types named in a fallback line


# -- what kind of file ----------------------------------------------------------------------
METADATA_PROPS = 14  # ModelProto.metadata_props: repeated StringStringEntryProto (key 1, value 2)


def read_metadata(path: Path) -> dict[str, str]:
    """The metadata_props of an ONNX file, without onnx and without parsing the graph: the
    file is mapped into memory and the ModelProto's top-level fields are walked, the graph
    skipped by its length (its pages are never read)."""
    path = Path(path)
    props: dict[str, str] = {}
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for field, wire, value in fields(data):
                if field != METADATA_PROPS or wire != 2:
                    continue
                entry = {key: data[slice(*span)].decode()
                         for key, kind, span in fields(data, *value) if kind == 2}
                props[entry.get(1, "")] = entry.get(2, "")
    except (ValueError, UnicodeDecodeError) as exc:
        raise PipelineError(f"cannot read {path}: not an ONNX model ({exc})") from None
    return props


@dataclass(frozen=True)
class FileKind:
    weights: str  # "fp32", "int8" or "fp16" (metadata `weights`; absent: fp32)
    text: bool  # strings in, strings out (metadata `format` nmt-text-1)

    @classmethod
    def of(cls, meta: dict[str, str]) -> FileKind:
        return cls(meta.get("weights", "fp32"), meta.get("format", "").startswith("nmt-text"))


# -- which providers --------------------------------------------------------------------------
def gpu_present(devices: Path = Path("/dev")) -> bool:
    """A CUDA device node (`/dev/nvidia0`, ...) exists on Linux; elsewhere let the session
    tell."""
    if sys.platform != "linux":
        return True
    return any(devices.glob("nvidia[0-9]*"))


def cuda_unavailable_reason(available: list[str]) -> str:
    """Why CUDA cannot run here ("" when it can)."""
    if CUDA not in available:
        return "this onnxruntime has no CUDA provider"
    if not gpu_present():
        return "no NVIDIA GPU found"
    return ""


def providers_for(choice: str, kind: FileKind, available: list[str]) -> list[str]:
    """The providers to ask for (see the module docstring); `available` is
    onnxruntime.get_available_providers()."""
    if choice not in CHOICES:
        raise PipelineError(f"provider must be auto, cuda or cpu, not {choice!r}")
    why_not = cuda_unavailable_reason(available)
    if kind.weights == "fp16":
        if choice == "cpu" or why_not:
            because = "--provider cpu" if choice == "cpu" else why_not
            raise PipelineError(f"model.fp16.onnx runs on CUDA only ({because}; on the CPU "
                                f"float16 is slower than float32): use model.onnx or "
                                f"model.int8.onnx there")
        return [CUDA, CPU]
    if choice == "cuda":
        if why_not:
            raise PipelineError(f"provider cuda is not available: {why_not} (use cpu)")
        return [CUDA, CPU]
    if choice == "cpu" or why_not or kind.weights == "int8" or kind.text:
        return [CPU]
    return [CUDA, CPU]


# -- what ran where ---------------------------------------------------------------------------
def assignments(session) -> Counter | None:
    """{(provider, op type): nodes} over the whole file (subgraphs included), from ONNX
    Runtime's record; None where this onnxruntime cannot report it."""
    try:
        subgraphs = session.get_provider_graph_assignment_info()
    except (AttributeError, RuntimeError):  # older onnxruntime, or recording not enabled
        return None
    counts: Counter = Counter()
    for subgraph in subgraphs:
        for node in subgraph.get_nodes():
            counts[subgraph.ep_name, node.op_type] += 1
    return counts


def describe(session) -> str:
    """`CPUExecutionProvider 152 nodes`, or `CUDAExecutionProvider 148 nodes,
    CPUExecutionProvider 4 nodes (Shape x3, Gather)`: the CPU's op types named when another
    provider ran the rest."""
    counts = assignments(session)
    if counts is None:
        return f"{session.get_providers()[0]} (node placement not reported by this onnxruntime)"
    per_provider: Counter = Counter()
    for (provider, _), n in counts.items():
        per_provider[provider] += n
    parts = []
    for provider, n in sorted(per_provider.items(), key=lambda item: item[0] == CPU):
        part = f"{provider} {n} node{'s' * (n != 1)}"
        if provider == CPU and len(per_provider) > 1:
            part += f" ({fallback_ops(counts)})"
        parts.append(part)
    return ", ".join(parts)


def fallback_ops(counts: Counter) -> str:
    ops = sorted(((n, op) for (provider, op), n in counts.items() if provider == CPU),
                 reverse=True)
    shown = [op + (f" x{n}" if n > 1 else "") for n, op in ops[:SHOWN_OPS]]
    rest = len(ops) - SHOWN_OPS
    return ", ".join(shown) + (f" and {rest} more op types" if rest > 0 else "")


def fallback_warning(session, name: str) -> str:
    """One line when a file forced onto CUDA runs nodes on the CPU ("" otherwise)."""
    counts = assignments(session)
    if counts is None or CUDA not in session.get_providers():
        return ""
    on_cpu = sum(n for (provider, _), n in counts.items() if provider == CPU)
    if not on_cpu:
        return ""
    return (f"{name} on CUDA: {on_cpu} of {sum(counts.values())} nodes run on the CPU "
            f"({fallback_ops(counts)}), with copies between the devices at each step")
