"""Greedy and batched beam search over `Transformer.encode` / `decode_step` (with KV cache).

Both never emit PAD, BOS or UNK (their logits are masked), so a rare word becomes byte pieces
instead of `<unk>`. Scores follow ONNX Runtime's BeamSearch operator, sum(log p) /
length**length_penalty with length = generated tokens + 1: the EOS of a hypothesis that ends,
the limit of one cut there (the operator counts its BOS). So the exported file ranks and scores
hypotheses the same way whether a sentence goes to the operator (alone) or to the batch Loop.
"""

from __future__ import annotations

import torch
from torch import Tensor

from src.core.special_ids import BANNED, BOS, EOS, PAD
from src.data.batching import clip_source, pad
from src.nmt.model import Transformer
from src.runtime.contract import max_new_tokens


def max_output_length(src: Tensor, ratio: float, model: Transformer) -> int:
    """src.runtime.generation's rule for a batch of source rows (with EOS)."""
    return max_new_tokens(int((src != PAD).sum(1).max()), ratio, model.max_positions - 1)


# float() reads "-INF" too: pragma: no mutate
NEG_INF = float("-inf")  # pragma: no mutate


def _log_probs(logits: Tensor) -> Tensor:
    """(rows, vocabulary) logits -> log-probabilities, banned ids at -inf."""
    logits = logits.float()
    logits[:, list(BANNED)] = NEG_INF
    return torch.log_softmax(logits, dim=1)


def greedy_search(model: Transformer, src: Tensor, max_len: int, length_penalty: float = 1.0,
                  with_scores: bool = False):
    """src (B, S) -> token ids per row, EOS excluded; `with_scores`: (ids, score) per row, the
    score sum(log p) / length**length_penalty as the beam search's (tokens + 1)."""
    with torch.no_grad():
        return _greedy(model, src, max_len, length_penalty, with_scores)


# The searches' bodies are plain functions (no decorator) so that mutation testing reaches them.
def _greedy(model: Transformer, src: Tensor, max_len: int, length_penalty: float,
            with_scores: bool):
    batch = src.shape[0]
    memory, src_mask = model.encode(src)
    cross = model.cross_kv(memory)
    # an empty cache's device and dtype: None is the CPU and float32, what tests run on
    cache = model.empty_cache(batch, src.device, memory.dtype)  # pragma: no mutate
    tokens = src.new_full((batch, 1), BOS)  # src's device and dtype (long)
    done = src.new_zeros(batch, dtype=torch.bool)
    total = src.new_zeros(batch, dtype=torch.float)  # sum of log p of each row's tokens
    lengths = src.new_zeros(batch, dtype=torch.float)
    out = []
    for _ in range(max_len):
        logits, cache = model.decode_step(tokens, cache, cross, src_mask)
        logp = _log_probs(logits)
        best, nxt = logp.max(1)
        total += best.masked_fill(done, 0.0)
        lengths += (~done).float()
        nxt = nxt.masked_fill(done, EOS)
        out.append(nxt)
        done = done | (nxt == EOS)
        # stopping once all rows are done only saves steps (done rows add nothing)
        if bool(done.all()):  # pragma: no mutate
            break
        tokens = nxt[:, None]
    ids = torch.stack(out, 1).tolist() if out else [[] for _ in range(batch)]
    hyps = [row[: row.index(EOS)] if EOS in row else row for row in ids]
    if not with_scores:
        return hyps
    # a row cut at the limit counts one more, as one that ended counts its EOS
    scores = (total / (lengths + (~done).float()) ** length_penalty).tolist()
    return list(zip(hyps, scores))


def beam_search(
    model: Transformer, src: Tensor, beam: int, max_len: int, length_penalty: float = 1.0,
    with_scores: bool = False, n_best: int = 0,
):
    """Batched beam search; returns the best finished hypothesis per row, EOS excluded
    (`with_scores`: (ids, score) per row, the score as ranked; `n_best` N > 0: a list of the N
    best (ids, score) per row, best first, equal scores in the order they finished).

    A row stops when it holds `beam` finished hypotheses (early stopping, as in ORT/HF with
    early_stopping=True); rows still open at max_len finish with their live beams.
    """
    if beam == 1 and not n_best:
        return greedy_search(model, src, max_len, length_penalty, with_scores)
    with torch.no_grad():
        return _ranked(_beam(model, src, beam, max_len, length_penalty), with_scores, n_best)


def _beam(model: Transformer, src: Tensor, beam: int, max_len: int, length_penalty: float
          ) -> list[list[tuple[float, list[int]]]]:
    """Each row's finished (score, ids) hypotheses, in the order they finished."""
    batch = src.shape[0]
    memory, src_mask = model.encode(src)
    # Every row's encoder state repeated beam times: (B*K, ...), row-major.
    memory = memory.repeat_interleave(beam, dim=0)
    src_mask = src_mask.repeat_interleave(beam, dim=0)
    cross = model.cross_kv(memory)
    # an empty cache's device and dtype: None is the CPU and float32, what tests run on
    cache = model.empty_cache(batch * beam, src.device, memory.dtype)  # pragma: no mutate
    # new tensors on src's device; ids in its dtype (long), scores in float
    scores = src.new_full((batch, beam), NEG_INF, dtype=torch.float)
    scores[:, 0] = 0.0  # only one live beam at the start, the others are copies
    history = src.new_full((batch * beam, 0), BOS)
    tokens = src.new_full((batch * beam, 1), BOS)
    row_start = src.new_tensor([b * beam for b in range(batch)])[:, None]  # (B, 1)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    open_rows = [True] * batch
    for step in range(max_len):
        logits, cache = model.decode_step(tokens, cache, cross, src_mask)
        logp = _log_probs(logits).view(batch, beam, -1)
        vocab = logp.shape[-1]
        candidates = (scores.unsqueeze(-1) + logp).view(batch, -1)  # (B, K*V)
        # 2K candidates hold K that do not end (each beam ends in one at most); more change
        # nothing, and -1 is the last dimension whether given or not: pragma: no mutate
        top_scores, top_ids = candidates.topk(2 * beam, dim=-1)  # pragma: no mutate
        src_beam, token = top_ids // vocab, top_ids % vocab
        # Filled as lists, made tensors once: a tensor's item assignment costs microseconds,
        # and a step makes up to 3 x beam of them per row.
        next_scores = [[NEG_INF] * beam for _ in range(batch)]
        # any beam would do in a closed row's slots (its scores are -inf)
        next_beam = [[0] * beam for _ in range(batch)]  # pragma: no mutate
        next_token = [[EOS] * beam for _ in range(batch)]
        length = step + 1  # generated tokens including this one (EOS counts)
        ts, tb, tt = top_scores.tolist(), src_beam.tolist(), token.tolist()
        for b in range(batch):
            if not open_rows[b]:
                continue
            kept = 0
            for rank in range(2 * beam):  # pragma: no mutate (kept reaches beam within 2K)
                score, k, tok = ts[b][rank], tb[b][rank], tt[b][rank]
                if score == NEG_INF:
                    break
                if tok == EOS:
                    if rank < beam:  # only EOS candidates that would have survived count
                        hyp = history[b * beam + k].tolist()
                        finished[b].append((score / length**length_penalty, hyp))
                    continue
                next_scores[b][kept], next_beam[b][kept], next_token[b][kept] = score, k, tok
                kept += 1
                if kept == beam:
                    break
            if len(finished[b]) >= beam:
                open_rows[b] = False
        if not any(open_rows):
            break
        next_scores, next_beam = scores.new_tensor(next_scores), src.new_tensor(next_beam)
        next_token = src.new_tensor(next_token)
        # Reorder caches and histories to follow the surviving beams: index (B*K,)
        flat = (next_beam + row_start).view(-1)
        cache = [(k.index_select(0, flat), v.index_select(0, flat)) for k, v in cache]
        history = torch.cat([history.index_select(0, flat), next_token.view(-1, 1)], dim=1)
        scores = next_scores.masked_fill(~src.new_tensor(open_rows, dtype=torch.bool)[:, None],
                                         NEG_INF)
        tokens = next_token.view(-1, 1)
    length = history.shape[1] + 1  # cut at the limit: its tokens + 1, as an ending's EOS
    for b in range(batch):
        if open_rows[b] or not finished[b]:  # ran out of length: live beams are candidates
            for k in range(beam):
                s = float(scores[b, k])
                if s > NEG_INF:
                    finished[b].append((s / length**length_penalty,
                                        history[b * beam + k].tolist()))
    return finished


def _ranked(finished: list[list[tuple[float, list[int]]]], with_scores: bool, n_best: int):
    """`beam_search`'s result from each row's (score, ids) hypotheses in the order they
    finished."""
    if n_best:
        return [[(hyp, score) for score, hyp in sorted(f, key=lambda x: -x[0])[:n_best]]
                for f in finished]
    # every row holds a hypothesis: one finished, or its live beams at the length limit
    best = [max(f, key=lambda x: x[0]) for f in finished]
    if with_scores:
        return [(hyp, score) for score, hyp in best]
    return [hyp for _, hyp in best]


def length_sorted_batches(sources: list[list[int]], batch_size: int) -> list[list[int]]:
    """Index lists of similar-length sources (little padding): how evaluate, validation and
    export's parity check batch the PyTorch search."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def source_batch(sources: list[list[int]], idx: list[int], max_positions: int) -> Tensor:
    """The rows `idx` of `sources`, clipped to the model's positions and right-padded: (B, S)."""
    return pad([clip_source(sources[i], max_positions) for i in idx])


def translate_ids(
    model: Transformer,
    sources: list[list[int]],
    beam: int,
    length_penalty: float,
    max_length_ratio: float,
    batch_size: int,
    progress=None,
    with_scores: bool = False,
) -> list:
    """Search every source (id lists) in length-sorted batches; output order = input order.

    `progress` is an optional rich Progress to advance. beam 1 is greedy. `with_scores`:
    (ids, score) per source, the score as `beam_search` ranks hypotheses.
    """
    device = next(model.parameters()).device  # pragma: no mutate (None: the CPU, as tested)
    out: list = [[] for _ in sources]
    task = progress.add_task("translate", total=len(sources)) if progress else None
    for idx in length_sorted_batches(sources, batch_size):
        src = source_batch(sources, idx, model.max_positions)
        src = src.to(device)  # pragma: no mutate (as above)
        max_len = max_output_length(src, max_length_ratio, model)
        found = beam_search(model, src, beam, max_len, length_penalty, with_scores)
        for i, hyp in zip(idx, found):
            out[i] = hyp
        if progress:
            progress.advance(task, len(idx))
    return out
