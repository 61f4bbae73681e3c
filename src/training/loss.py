"""The training loss: label-smoothed cross-entropy over the non-pad target tokens, fused.

For logits x (N, V), label y and smoothing eps (Szegedy et al., 2016; PyTorch's definition):

    loss_i = (1 - eps) * (lse_i - x_iy) + eps * (lse_i - sum_j x_ij / V),  lse_i = log sum_j e^x_ij
    d loss_i / d x_ij = softmax(x_i)_j - (1 - eps) [j = y] - eps / V

`F.cross_entropy(label_smoothing=eps)` materialises log-softmax, sums it for the smoothing term
and scatters the NLL gradient into another (N, V) buffer; this normalises once, returns
the plain NLL from the same pass (validation and logs need it; a second cross-entropy for it
would cost another pass over (N, V)), and builds the gradient in one buffer. The arithmetic is
fp32 whatever the logits' dtype (bf16 under autocast); the gradient goes back in the logits'
dtype. The log-sum-exp is never formed apart: log_softmax gives x - lse directly, and its
exponential is the softmax the gradient needs, built in the forward pass while the rows are
still in cache.
"""

from __future__ import annotations

import torch
from torch import Tensor


def smoothed_cross_entropy(log_p: Tensor, rows: Tensor, labels: Tensor, eps: float
                           ) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL of (N, V) log-probabilities."""
    nll = -log_p[rows, labels].sum()
    return smoothed_loss(nll, log_p.sum() if eps else None, eps, log_p.shape[1]), nll


def smoothed_loss(nll: Tensor, log_p_sum: Tensor | None, eps: float, vocab: int) -> Tensor:
    """(1 - eps) * NLL - eps / V * (the sum of every log-probability): the smoothed loss from
    the two sums it needs (`log_p_sum` only with eps)."""
    loss = (1.0 - eps) * nll
    if eps:
        loss = loss - eps / vocab * log_p_sum
    return loss


def smoothed_cross_entropy_grad_(p: Tensor, rows: Tensor, labels: Tensor, eps: float) -> Tensor:
    """P - (1 - eps) onehot(label) - eps / V, in place of the probabilities P."""
    if eps:
        p.sub_(eps / p.shape[1])
    p[rows, labels] -= 1.0 - eps
    return p


class LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        log_p = torch.log_softmax(logits, dim=1, dtype=torch.float32)  # (N, V): x - lse
        rows = torch.arange(len(labels), device=logits.device)
        loss, nll = smoothed_cross_entropy(log_p, rows, labels, eps)
        if ctx.needs_input_grad[0]:
            # The gradient is known now, up to the incoming scale: build it in place of log_p
            # while that is still in cache, instead of keeping log_p for backward.
            grad = smoothed_cross_entropy_grad_(log_p.exp_(), rows, labels, eps)
            ctx.save_for_backward(grad.to(logits.dtype))
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        (grad,) = ctx.saved_tensors
        # In place: the graph is freed after the one backward of a step (no retain_graph).
        return grad.mul_(grad_loss), None, None


def label_smoothed_cross_entropy(logits: Tensor, labels: Tensor, eps: float
                                 ) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss (differentiable) and summed NLL (not) of (N, V) logits."""
    return LabelSmoothedCrossEntropy.apply(logits, labels, float(eps))


class RDropLoss(torch.autograd.Function):
    """R-Drop's loss in one pass: one log-softmax of the (2N, V) logits serves the smoothed
    cross-entropy of both passes and the symmetric KL between them, and the gradient is built in
    the forward pass, as in `LabelSmoothedCrossEntropy`.

    With L = log P, D = L1 - L2 and S = KL(P1||P2) + KL(P2||P1) = sum_j (P1_j - P2_j) D_j:
        dS/dz1 = P1 (D - <P1, D>) + (P1 - P2),   dS/dz2 = -P2 (D - <P2, D>) - (P1 - P2)
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, eps: float, alpha: float
                ) -> tuple[Tensor, Tensor]:
        n = len(labels)
        log_p = torch.log_softmax(logits, dim=1, dtype=torch.float32)  # (2N, V)
        rows = torch.arange(2 * n, device=logits.device)
        gold = torch.cat([labels, labels])
        ce, nll = smoothed_cross_entropy(log_p, rows, gold, eps)
        diff = log_p[:n] - log_p[n:]  # D
        p = log_p.exp_()  # log_p is not needed past D: its buffer becomes P
        p1, p2 = p[:n], p[n:]
        delta = p1 - p2
        kl = (delta * diff).sum()
        if ctx.needs_input_grad[0]:
            # d(0.5 * alpha/2 * S); P1 and P2 are read before `p` becomes the CE gradient.
            scale = alpha / 4
            kl_grad1 = (diff - (p1 * diff).sum(1, keepdim=True)).mul_(p1).add_(delta)
            kl_grad2 = (diff - (p2 * diff).sum(1, keepdim=True)).mul_(p2).add_(delta).neg_()
            grad = smoothed_cross_entropy_grad_(p, rows, gold, eps).mul_(0.5)  # d(0.5 * CE)
            grad[:n].add_(kl_grad1, alpha=scale)
            grad[n:].add_(kl_grad2, alpha=scale)
            ctx.save_for_backward(grad.to(logits.dtype))
        ctx.mark_non_differentiable(nll)
        return 0.5 * (ce + alpha / 2 * kl), 0.5 * nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_loss), None, None, None


def rdrop_loss(logits: Tensor, labels: Tensor, eps: float, alpha: float
               ) -> tuple[Tensor, Tensor]:
    """R-Drop (Liang et al., NeurIPS 2021) over two dropout passes of the same N tokens.

    `logits` (2N, V): the first pass's rows, then the second's, for `labels` (N,). The paper's
    loss is CE1 + CE2 + alpha/2 (KL(P1||P2) + KL(P2||P1)); this returns half of it, so the
    cross-entropy weighs what one pass weighs without R-Drop and `alpha` keeps the paper's
    meaning. The second value is the NLL averaged over the two passes (for the logs).
    """
    return RDropLoss.apply(logits, labels, float(eps), float(alpha))


class ProjectedCrossEntropy(torch.autograd.Function):
    """The output projection and `LabelSmoothedCrossEntropy` together, for bf16 on the CPU:
    every product `rows` rows at a time, the rows padded with zeros to whole chunks.

    oneDNN, which runs bf16 products on the CPU, builds a kernel for each new product shape
    and keeps the last 1,024 (docs/training_speed.md). N, the step's target tokens, is new
    almost every step, and building the kernels of the three (N, V) products cost more than
    running them; here their shapes are (rows, D) x (D, V), (rows, V) x (V, D) and
    (V, N_padded) x (N_padded, D), with N_padded a multiple of `rows`. A chunk's logits,
    log-probabilities and gradient stay in cache; only the gradient (N_padded, V), in the
    logits' dtype, is kept for backward. Padded rows have zero gradients."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, eps: float, rows: int
                ) -> tuple[Tensor, Tensor]:
        w = weight.to(hidden.dtype)  # bf16 under autocast: the cast a linear layer makes
        n = len(labels)
        hidden = torch.cat([hidden, hidden.new_zeros(-(-n // rows) * rows - n,
                                                     hidden.shape[1])])  # (N_padded, D)
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad = hidden.new_zeros((len(hidden), w.shape[0])) if want_grad else None
        picked = hidden.new_empty(n, dtype=torch.float32)  # log p of each label
        log_p_sum = hidden.new_zeros((), dtype=torch.float32)  # for the smoothing term
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            logits = hidden[start:start + rows] @ w.t()  # (rows, V)
            log_p = torch.log_softmax(logits, dim=1, dtype=torch.float32)[: stop - start]
            index = torch.arange(stop - start, device=hidden.device)
            picked[start:stop] = log_p[index, labels[start:stop]]
            if eps:
                log_p_sum += log_p.sum()
            if want_grad:
                grad[start:stop] = smoothed_cross_entropy_grad_(log_p.exp_(), index,
                                                                labels[start:stop], eps)
        # as `smoothed_cross_entropy` sums them: the NLL is the unchunked one's, bit for bit
        nll = -picked.sum()
        loss = smoothed_loss(nll, log_p_sum, eps, w.shape[0])
        if want_grad:
            ctx.save_for_backward(grad, hidden, w)
            ctx.weight_dtype, ctx.rows, ctx.n = weight.dtype, rows, n
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        grad, hidden, w = ctx.saved_tensors
        grad = grad.mul_(grad_loss)  # in place: the graph is freed after one backward
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:  # (N, D), `rows` rows a product
            grad_hidden = torch.cat([grad[i:i + ctx.rows] @ w
                                     for i in range(0, ctx.n, ctx.rows)])[: ctx.n]
        if ctx.needs_input_grad[1]:  # (V, D)
            grad_weight = (grad.t() @ hidden).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None


def projected_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, eps: float,
                            rows: int = 256) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss (differentiable in `hidden` and `weight`) and summed NLL of
    the logits `hidden @ weight.T`, `rows` rows at a time (`ProjectedCrossEntropy`)."""
    return ProjectedCrossEntropy.apply(hidden, weight, labels, float(eps), int(rows))
