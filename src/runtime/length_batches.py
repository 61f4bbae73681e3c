"""Sentences into batches by length, and the outputs back into the lines' order: the one
batching every translator (and whatever scores or compares a file) uses."""

from __future__ import annotations

from collections.abc import Callable, Mapping


def length_batches(lines: list[str], batch_size: int,
                   lengths: Mapping[int, int] | None = None) -> list[list[int]]:
    """Indices of the non-blank lines, shortest first (ties by position), cut into batches:
    by `lengths[i]` (source tokens: the generation model's translator, whose batches then hold
    little padding) or, without them, by characters (the text model tokenizes inside its
    graph). Whatever scores or compares a file uses the batches its translator makes, since
    int8 models quantize activations per batch: an int8 translation can change with the
    sentences that share its batch."""
    def size(i: int):
        return lengths[i] if lengths is not None else len(lines[i])

    order = sorted((i for i, line in enumerate(lines) if line.strip()),
                   key=lambda i: (size(i), i))
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def translate_in_batches(lines: list[str], batch_size: int, run: Callable[[list[int]], list],
                         lengths: Mapping[int, int] | None = None, blank="") -> list:
    """One output per line, in order, `blank` for blank lines; `run` translates a batch
    (indices) of `length_batches`."""
    if len(lines) == 1:  # one sentence (a request, a benchmark's batch 1): nothing to batch
        return list(run([0])) if lines[0].strip() else [blank]
    out = [blank] * len(lines)
    for idx in length_batches(lines, batch_size, lengths):
        for i, text in zip(idx, run(idx)):
            out[i] = text
    return out

