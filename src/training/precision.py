"""The arithmetic a training step runs in: `train.precision` (auto | fp32 | bf16) made concrete.

bf16 runs the matmuls (linear, attention) under `torch.autocast`; weights, AdamW's state, the
loss, softmax and LayerNorm statistics stay fp32 (autocast keeps those ops in fp32 and the
residual stream stays fp32 by type promotion), and so do checkpoints and model.pt: export,
evaluate and resume never see bf16.

`auto` asks the CPU whether it multiplies bf16 natively (AMX tiles, or AVX-512 BF16's dot
product), as torch's own CPU feature checks report it; elsewhere bf16 is emulated and several
times slower than fp32, so a request for it there falls back to fp32 with one line saying so.
On CUDA `auto` is fp32 with TF32 matmuls (tensor cores, fp32 storage, no autocast): on an H200
it trained faster than bf16 autocast at every model size and batch measured (docs/gpu.md), as
the casts around each op cost more than bf16 saves on models this size. `bf16` asked for on a
GPU is bf16 autocast, or fp16 with a gradient scaler where the GPU has no bf16.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    name: str  # "fp32", "tf32", "bf16" or "fp16": what the step runs in (a trajectory key)
    device_type: str  # "cpu" or "cuda"
    reason: str  # why, for the start line

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    @property
    def needs_scaler(self) -> bool:
        """fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range."""
        return self.name == "fp16"

    def set_matmul_precision(self) -> None:
        """TF32 for CUDA's fp32 matmuls and convolutions when the step is "tf32", full fp32
        otherwise (process-wide switches; the CPU's matmuls are not touched)."""
        if self.device_type != "cuda":
            return
        tf32 = self.name == "tf32"
        matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
        if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing it with allow_tf32 fails
            matmul.fp32_precision = conv.fp32_precision = "tf32" if tf32 else "ieee"
        else:
            matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32

    def autocast(self) -> AbstractContextManager:
        dtype = self.autocast_dtype
        return torch.autocast(self.device_type, dtype=dtype or torch.float32,
                              enabled=dtype is not None)


def cpu_bf16_feature() -> str:
    """The CPU feature that multiplies bf16 natively ("AMX", "AVX-512 BF16"), or ""."""
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "AVX-512 BF16"
    return ""


def resolve_precision(requested: str, device: torch.device) -> tuple[Precision, str]:
    """What `train.precision` means on this device, and a warning line ("" for none)."""
    if requested == "fp32":
        return Precision("fp32", device.type, "train.precision fp32"), ""
    if device.type == "cuda":
        if requested == "auto":
            return Precision("tf32", "cuda", "train.precision auto: fp32 with TF32 matmuls on "
                             "a GPU"), ""
        if not torch.cuda.is_bf16_supported():
            return (Precision("fp16", "cuda", "this GPU has no bf16; fp16 with a loss scaler"),
                    "train.precision bf16: this GPU has no bf16, training in fp16 with a scaler")
        return Precision("bf16", "cuda", "train.precision bf16: GPU bf16"), ""
    feature = cpu_bf16_feature()
    if feature:
        return Precision("bf16", device.type,
                         f"train.precision {requested}: the CPU has {feature}"), ""
    if requested == "bf16":
        return (Precision("fp32", device.type, "bf16 asked for, but the CPU has no native bf16"),
                "train.precision bf16: this CPU has neither AMX nor AVX-512 BF16, where bf16 "
                "is emulated and several times slower; training in fp32")
    return Precision("fp32", device.type, "auto: the CPU has neither AMX nor AVX-512 BF16"), ""
