"""A batch's real tokens as the rows of one matrix: how a bf16 training step on the CPU runs.

A (B, T) batch of sentences padded to its longest holds ~15% padding in the default recipe,
and every layer between two attentions (the linear layers, LayerNorm, dropout, the residual
additions) works on each position alone, padding included. `PackedRows` lists the real
positions once per batch; those layers then run on the real tokens only, and attention, the
one place that needs the (B, T) grid, gets it back (`unpack`) and hands its output over packed
(`pack`).

The rows are also what oneDNN sees. It runs bf16 products on the CPU and builds a kernel for
every new product shape, keeping only the last 1,024: a first call took ten times a cached one
(a (1,201, 256) x (256, 256) product on an AMX Xeon: 1.58 ms, cached 0.13-0.17 ms;
docs/training_speed.md), and a batch's token count is new almost every step. So the real rows
are followed by filler rows up to a multiple of ROW_BUCKET: the products take a few dozen
shapes, whose kernels stay cached.

Filler rows copy position 0 and pad positions read the first filler row (or row 0): their values
are finite and go nowhere that matters. Attention masks pad keys (weight exactly 0) and pack
drops pad queries, and the loss reads real positions only, so no gradient other than an exact
zero reaches a filler row or a pad position; the backward passes below leave them out instead
of adding those zeros.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Packed rows are a multiple of this: few distinct product shapes (see the module docstring).
ROW_BUCKET = 64


class PackedRows:
    """Where the real tokens of a (B, T) batch sit, and moves between the grid and the rows."""

    def __init__(self, real: Tensor):
        """real: (B, T) bool, True on real tokens; position (0, 0) must be real (it is: every
        source ends with EOS and every decoder input starts with BOS)."""
        self.batch, self.length = real.shape
        self.positions = real.reshape(-1).nonzero().squeeze(1)  # (N,) flat, row-major order
        self.n_real = n = len(self.positions)
        n_rows = -(-n // ROW_BUCKET) * ROW_BUCKET
        # row i of the packed matrix holds flat position rows[i]; fillers repeat position 0
        self.rows = torch.cat([self.positions, self.positions.new_zeros(n_rows - n)])
        # position p of the grid reads packed row gather[p]; pad positions read a filler row
        self.gather = torch.full((self.batch * self.length,), n if n_rows > n else 0,
                                 dtype=torch.long, device=real.device)
        self.gather[self.positions] = torch.arange(n, device=real.device)

    def pack(self, grid: Tensor) -> Tensor:
        """(B, T, ...) or (B * T, ...) -> (rows, ...)."""
        return _Pack.apply(grid.reshape(self.batch * self.length, *grid.shape[-1:]), self)

    def unpack(self, rows: Tensor) -> Tensor:
        """(rows, D) -> (B, T, D)."""
        return _Unpack.apply(rows, self).view(self.batch, self.length, -1)

    def pe_rows(self) -> Tensor:
        """(rows,) the position within its sentence of every packed row."""
        return self.rows % self.length


class _Pack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grid: Tensor, packing: PackedRows) -> Tensor:
        ctx.packing = packing
        return grid.index_select(0, packing.rows)

    @staticmethod
    def backward(ctx, grad_rows: Tensor):
        p = ctx.packing
        grad = grad_rows.new_zeros(p.batch * p.length, grad_rows.shape[1])
        return grad.index_copy_(0, p.positions, grad_rows[: p.n_real]), None


class _Unpack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows: Tensor, packing: PackedRows) -> Tensor:
        ctx.packing, ctx.n_rows = packing, len(rows)
        return rows.index_select(0, packing.gather)

    @staticmethod
    def backward(ctx, grad_grid: Tensor):
        p = ctx.packing
        grad = grad_grid.new_zeros(ctx.n_rows, grad_grid.shape[-1])
        flat = grad_grid.reshape(-1, grad_grid.shape[-1])
        torch.index_select(flat, 0, p.positions, out=grad[: p.n_real])
        return grad, None
