"""Beam search and greedy search as ONNX `Loop`s whose batch shrinks.

ONNX Runtime's BeamSearch operator decodes every sentence of a batch until the longest is done;
on the test split sorted into batches of 32, a third of the decoder's row-steps went to
sentences that had already ended (docs/engines.md). This graph runs the same encoder and
decoder-step nodes (exported by src/graph/onnx_graph.py), and after each step drops the
sentences that are done (`Compress` on every per-row state: the self-attention cache, the
cross-attention keys and values, the source mask, the hypotheses), writing each sentence's best
hypothesis into the output by its original index. Same inputs and the same outputs as the
BeamSearch node: `sequences` (B, N, T) with BOS, the tokens, then PAD (EOS is not written), and
`sequences_scores` (B, N), each hypothesis's sum(log p) / length**length_penalty (length = its
tokens + 1: its EOS, or the limit it was cut at), the N = `num_return_sequences` best of each
sentence, best first (greedy search: N is 1).

The search is `src.nmt.search.beam_search`, step for step: the 2K best continuations of a
sentence's K beams; an EOS among the first K finishes a hypothesis (score / length**penalty,
length counting the EOS); the first K others go on; a sentence is done when it holds K finished
hypotheses; at the length limit its live beams compete too, scored by (length + 1), as the
operator scores them. Each sentence keeps its N best hypotheses so far (`best`, (N_open, N)
scores, and their tokens in the output), merged with each step's finished ones by one TopK:
among equal scores the one kept longer comes first.
Ties go to the earlier candidate, as there. `min_length` bans EOS before that length (BOS
counted), as ONNX Runtime's operator does. The first step runs one row per sentence, as its K
beams would be K copies of one row.
Greedy search, the one-beam case, has a body of its own (`_greedy_body`): the best token of
each row and its running log-probability, no candidate lists, no reordering.

The weights stay where ONNX Runtime pre-packs them: the encoder's in the graph that runs it,
the decoder's one scope above the Loop body (it looks up one level for constant initializers;
two levels up, its int8 products ran 1.85x slower in the profile).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from src.core.special_ids import BOS, EOS, PAD

INT64, INT32, FLOAT, BOOL = (TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT,
                             TensorProto.BOOL)


def inline(graph: onnx.GraphProto, prefix: str, inputs: dict[str, str],
           keep: set[str]) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """`graph`'s nodes with every value name prefixed, its inputs wired to `inputs` and names
    in `keep` (initializers) unchanged; returns the nodes and graph output -> new name."""
    def rename(name: str) -> str:
        if not name or name in keep:
            return name
        return inputs.get(name, prefix + name)

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + node.name if node.name else ""
        copy.input[:] = [rename(n) for n in node.input]
        copy.output[:] = [rename(n) for n in node.output]
        nodes.append(copy)
    return nodes, {o.name: rename(o.name) for o in graph.output}


class Nodes:
    """A node list with short constructors: `n.op("Add", a, b)` returns the output name."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.count = prefix, [], 0

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self.count += 1
        name = out or f"{self.prefix}{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs) -> list[str]:
        self.count += 1
        names = [f"{self.prefix}{op_type.lower()}_{self.count}_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names

    def const(self, dtype: int, values: list, dims: list[int] | None = None) -> str:
        self.count += 1
        name = f"{self.prefix}const_{self.count}"
        self.nodes.append(helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, dtype, [len(values)] if dims is None else dims, values)))
        return name


def branch(b: Nodes, outputs: dict[str, tuple[str, int]]) -> onnx.GraphProto:
    """An If branch of `b`'s nodes; `outputs` maps a label to (value name, element type)."""
    return helper.make_graph(b.nodes, b.prefix.strip("/").replace("/", "_"), [], [
        helper.make_tensor_value_info(name, dtype, None) for name, dtype in outputs.values()])


def _state_names(n_layers: int) -> tuple[list[str], list[str]]:
    selfs = [f"past_{kv}_self_{i}" for i in range(n_layers) for kv in ("key", "value")]
    crosses = [f"past_{kv}_cross_{i}" for i in range(n_layers) for kv in ("key", "value")]
    return selfs, crosses


class Step:
    """What both Loop bodies start from: their carried values (`carried`, the small ones first,
    then the self-attention caches, cross-attention keys and values and the source mask), the
    names the body reads them by, their types, and the decoder-step nodes inlined to read
    them (`nodes`; `produced` maps its outputs to their names here)."""

    SMALL_TYPES = {"sents": INT64, "tokens": INT32, "scores": FLOAT, "history": INT32,
                   "best": FLOAT, "count": INT64, "out": INT32, "out_scores": FLOAT,
                   "mask": INT32}

    def __init__(self, decoder: onnx.GraphProto, n_layers: int, keep: set[str], prefix: str,
                 small: list[str]):
        self.prefix = prefix
        self.selfs, self.crosses = _state_names(n_layers)
        self.carried = [*small, *self.selfs, *self.crosses, "mask"]
        self.names = {c: prefix + c for c in self.carried}
        wiring = {"input_ids": self.names["tokens"], "encoder_attention_mask": self.names["mask"],
                  **{c: self.names[c] for c in self.selfs + self.crosses}}
        self.nodes, self.produced = inline(decoder, prefix + "decoder/", wiring, keep)
        caches = {v.name: v.type.tensor_type.elem_type for v in decoder.input}
        self.types = {**self.SMALL_TYPES, **{c: caches[c] for c in self.selfs + self.crosses}}
        self.iteration = prefix + "iteration"

    def graph(self, nodes: list[onnx.NodeProto], name: str, go_on: str,
              outputs: dict[str, str]) -> onnx.GraphProto:
        """The Loop body: (iteration, condition, carried...) -> (go_on, carried...)."""
        value = helper.make_tensor_value_info
        inputs = [value(self.iteration, INT64, []), value(self.prefix + "condition", BOOL, []),
                  *(value(self.names[c], self.types[c], None) for c in self.carried)]
        results = [value(go_on, BOOL, []),
                   *(value(outputs[c], self.types[c], None) for c in self.carried)]
        return helper.make_graph(nodes, name, inputs, results)


def _body(decoder: onnx.GraphProto, n_layers: int, vocab: int, keep: set[str],
          outer: dict[str, str]) -> onnx.GraphProto:
    """One step for the sentences still open. `outer` names values of the enclosing graph:
    beams (K, a scalar), beams_1 and two_beams ([K], [2K]), first_beams (2K,) bool,
    max_new (1,), min_length and length_penalty (scalars).

    The first step runs one row per sentence (its K beams would be K copies of the same row);
    every step's chosen rows (K per sentence) gather the next state, which expands it to K
    rows per sentence after the first. The cross-attention keys, values and source mask stay
    one per sentence: a sentence's K beams are K queries of one cross-attention
    (`_queries_per_sentence`)."""
    p = "step/"
    step = Step(decoder, n_layers, keep, p,
                ["sents", "tokens", "scores", "history", "best", "count", "out", "out_scores"])
    n = Nodes(p)
    n_open = n.op("Shape", step.names["sents"])                               # (1,) N
    heads, d_head, _ = _cross_input(decoder)
    n.nodes.extend(_queries_per_sentence(n, step.nodes, {step.names[c] for c in step.crosses},
                                         n_open, heads * d_head))
    const = {"zero": n.const(INT64, [0], []), "one": n.const(INT64, [1], []),
             "axis_1": n.const(INT64, [1]), "minus_inf": n.const(FLOAT, [float("-inf")], [])}
    top = _candidates(n, step, outer, vocab, n_open, const["one"])
    best, out, out_scores, count, base = _finish_hypotheses(n, step, outer, top, n_open, const)

    # The next beams: the first K continuations that are not EOS, in rank order (TopK keeps
    # the lower index first among equal scores).
    live_scores = n.op("Where", top["is_eos"], const["minus_inf"], top["scores"])
    next_scores, columns = n.ops("TopK", [live_scores, outer["beams_1"]], 2, axis=1)
    next_beam = n.op("GatherElements", top["source_beam"], columns, axis=1)   # (N, K)
    next_token = n.op("Cast", n.op("GatherElements", top["token"], columns, axis=1), to=INT32)
    order = n.op("Add", next_beam, n.op("Unsqueeze", base, const["axis_1"]))  # (N, K) rows

    state = {"sents": step.names["sents"], "scores": next_scores, "best": best, "count": count,
             "mask": step.names["mask"], **{c: step.names[c] for c in step.crosses},
             **{s: step.produced[s.replace("past_", "present_")] for s in step.selfs}}
    outputs = {**_next_state(n, step, outer, state, order, next_token, n_open, const),
               "out": out, "out_scores": out_scores}
    go_on = n.op("Greater", n.op("Size", outputs["sents"]), const["zero"])
    return step.graph(n.nodes, "search_step", go_on, outputs)


def _candidates(n: Nodes, step: Step, outer: dict[str, str], vocab: int, n_open: str,
                one: str) -> dict[str, str]:
    """Each sentence's 2K best continuations of its beams by log-probability (EOS banned
    before min_length): their `scores`, `source_beam`, `token` and `is_eos` (N, 2K), and
    `length` (tokens generated, this one included) and `rows_now` (1,) (beams per sentence
    in this step: 1 or K)."""
    logp = n.op("LogSoftmax", step.produced["logits"], axis=-1)               # (NK, 1, V)
    length = n.op("Add", step.iteration, one)
    banned = n.op("Less", length, outer["min_length"])
    rows_now = n.op("Div", n.op("Shape", step.names["tokens"], start=0, end=1), n_open)  # (1,)
    top_scores, top_ids = top_candidates(n, logp, step.names["scores"], n_open, vocab,
                                         outer["two_beams"], banned)
    vocab_c = n.const(INT64, [vocab], [])
    source_beam = n.op("Div", top_ids, vocab_c)                               # (N, 2K)
    token = n.op("Mod", top_ids, vocab_c)
    is_eos = n.op("Equal", token, n.const(INT64, [EOS], []))
    return {"scores": top_scores, "source_beam": source_beam, "token": token, "is_eos": is_eos,
            "length": length, "rows_now": rows_now}


def top_candidates(n: Nodes, logp: str, scores: str, n_open: str, vocab: int, two_beams: str,
                   banned: str) -> tuple[str, str]:
    """The 2K best continuations of each sentence: `logp` (N*Kn, 1, V) of its Kn beams (1 or
    K) plus their `scores` (N, Kn), EOS at -inf where the bool scalar `banned` holds. Returns
    their scores and their indices into the sentence's Kn*V candidates (N, 2K), as one TopK
    over all candidates returns them (best first, the lower index first among equals).

    Where the vocabulary splits into blocks (`block_width`), neither the (N, Kn*V) candidate
    scores nor a TopK over them are made: ONNX Runtime reads a TopK's row one element at a
    time and a ReduceMax's in vector registers (docs/engines.md). The 2K best candidates lie in
    the 2K blocks with the best maxima (a block left out has 2K better maxima before it, each
    a better candidate), and a beam's score shifts its blocks' maxima as it shifts their
    candidates. So: each block's maximum of log p, plus its beam's score; TopK of those;
    the 2K chosen blocks in their order in the row, gathered, their beams' scores added; TopK
    of those 2K * width candidates."""
    width = block_width(vocab)
    minus_one = n.const(INT64, [-1])
    if width is None:
        logp = n.op("Add", logp, _eos_ban(n, banned, vocab))
        beams = n.op("Reshape", logp, n.op("Concat", n_open, minus_one,
                                            n.const(INT64, [vocab]), axis=0))  # (N, Kn, V)
        candidates = n.op("Reshape", n.op("Add", beams, n.op(
            "Unsqueeze", scores, n.const(INT64, [2]))), n.op("Concat", n_open, minus_one, axis=0))
        top_scores, top_ids = n.ops("TopK", [candidates, two_beams], 2, axis=1)  # (N, 2K)
        return top_scores, top_ids
    blocks, block_of_eos = vocab // width, EOS // width
    axis_2 = n.const(INT64, [2])
    rows = n.op("Reshape", logp, n.const(INT64, [-1, vocab]))                 # (N*Kn, V)
    maxima, _, ban, _ = _block_maxima(n, rows, vocab, width, banned)          # (N*Kn, V/w)
    per_sentence = n.op("Concat", n_open, minus_one, axis=0)                  # [N, -1]
    block_scores = n.op("Reshape", n.op("Add", n.op(
        "Reshape", maxima, n.op("Concat", n_open, minus_one, n.const(INT64, [blocks]), axis=0)),
        n.op("Unsqueeze", scores, axis_2)), per_sentence)                     # (N, Kn*V/w)
    chosen = n.op("Min", two_beams, n.op("Shape", block_scores, start=1))    # (1,)
    best_blocks = n.ops("TopK", [block_scores, chosen], 2, axis=1)[1]
    in_order = n.ops("TopK", [best_blocks, chosen], 2, axis=1, largest=0)[0]  # (N, c) ascending
    picked = n.op("GatherElements", n.op("Reshape", logp, n.op(
        "Concat", n_open, minus_one, n.const(INT64, [width]), axis=0)), n.op(
        "Expand", n.op("Unsqueeze", in_order, axis_2), n.const(INT64, [1, 1, width])),
        axis=1)                                                               # (N, c, w)
    is_eos_block = n.op("Equal", n.op("Mod", in_order, n.const(INT64, [blocks], [])),
                        n.const(INT64, [block_of_eos], []))
    picked = n.op("Add", picked, n.op("Where", n.op("Unsqueeze", is_eos_block, axis_2), ban,
                                      n.const(FLOAT, [0.0] * width)))
    beam_scores = n.op("GatherElements", scores, n.op(
        "Div", in_order, n.const(INT64, [blocks], [])), axis=1)              # (N, c)
    candidates = n.op("Reshape", n.op("Add", picked, n.op("Unsqueeze", beam_scores, axis_2)),
                      per_sentence)                                           # (N, c*w)
    top_scores, local = n.ops("TopK", [candidates, two_beams], 2, axis=1)     # (N, 2K)
    width_c = n.const(INT64, [width], [])
    block = n.op("GatherElements", in_order, n.op("Div", local, width_c), axis=1)
    return top_scores, n.op("Add", n.op("Mul", block, width_c), n.op("Mod", local, width_c))


def _finish_hypotheses(n: Nodes, step: Step, outer: dict[str, str], top: dict[str, str],
                       n_open: str, const: dict[str, str]
                       ) -> tuple[str, str, str, str, str]:
    """Finished hypotheses: EOS among the first K candidates, finite. Each sentence keeps its
    N best (`best`, (N_open, N), and their tokens and scores in `out` and `out_scores`, by an If
    that runs only in steps where some hypothesis finishes); `count` its finished ones; `base`
    (N_open,) its first row."""
    names, axis_1 = step.names, const["axis_1"]
    finite = n.op("Not", n.op("IsInf", top["scores"], detect_positive=0))
    finished = n.op("And", n.op("And", top["is_eos"], outer["first_beams"]), finite)
    new_finished = n.op("ReduceSum", n.op("Cast", finished, to=INT64), axis_1, keepdims=0)
    count = n.op("Add", names["count"], new_finished)                         # (N,)
    base = n.op("Mul", n.op("Range", const["zero"], n.op("Squeeze", n_open), const["one"]),
                n.op("Squeeze", top["rows_now"]))                             # first rows
    some_finished = n.op("Greater", n.op("ReduceSum", new_finished, keepdims=0), const["zero"])
    f = Nodes(step.prefix + "finish/")
    penalty = f.op("Pow", f.op("Cast", top["length"], to=FLOAT), outer["length_penalty"])
    normalized = f.op("Where", finished, f.op("Div", top["scores"], penalty), const["minus_inf"])
    rows = f.op("Add", top["source_beam"], f.op("Unsqueeze", base, axis_1))   # (N, 2K)
    hypotheses = f.op("Gather", names["history"], rows, axis=0)               # (N, 2K, t)
    best, out, out_scores = keep_best(f, names, normalized, hypotheses, step.iteration, outer)
    finish = branch(f, {"best": (best, FLOAT), "out": (out, INT32),
                        "out_scores": (out_scores, FLOAT)})
    keep_as_is = Nodes(step.prefix + "unfinished/")
    unchanged = branch(keep_as_is, {k: (keep_as_is.op("Identity", names[k]), t)
                                    for k, t in (("best", FLOAT), ("out", INT32),
                                                 ("out_scores", FLOAT))})
    best, out, out_scores = n.ops("If", [some_finished], 3, then_branch=finish,
                                  else_branch=unchanged)
    return best, out, out_scores, count, base


def keep_best(n: Nodes, names: dict[str, str], scores: str, hypotheses: str, length: str,
              outer: dict[str, str]) -> tuple[str, str, str]:
    """Each open sentence's N best of its kept hypotheses (`names["best"]`, (N_open, N), their
    tokens in `names["out"]` (B, N, M) at the row `names["sents"]`) and the new ones, `scores`
    (N_open, C) (-inf: not a hypothesis) with their tokens `hypotheses` (N_open, C, `length`):
    the new best (N_open, N), out and out_scores. TopK ranks the kept ones first among equal
    scores, then the new ones in their order."""
    merged = n.op("Concat", names["best"], scores, axis=1)                   # (N, N + C)
    best, picked = n.ops("TopK", [merged, outer["returns_1"]], 2, axis=1)   # (N, N)
    missing = n.op("Sub", outer["max_new"], n.op("Unsqueeze", length, n.const(INT64, [0])))
    padded = n.op("Pad", hypotheses, n.op("Concat", n.const(INT64, [0, 0, 0, 0, 0]), missing,
                                          axis=0), n.const(INT32, [PAD], []))  # (N, C, M)
    where = n.op("Unsqueeze", names["sents"], n.const(INT64, [1]))
    pool = n.op("Concat", n.op("Gather", names["out"], names["sents"], axis=0), padded, axis=1)
    index = n.op("Expand", n.op("Unsqueeze", picked, n.const(INT64, [2])), n.op(
        "Concat", n.op("Shape", picked), n.op("Shape", pool, start=2), axis=0))
    chosen = n.op("GatherElements", pool, index, axis=1)                      # (N, N, M)
    return (best, n.op("ScatterND", names["out"], where, chosen),
            n.op("ScatterND", names["out_scores"], where, best))


def _next_state(n: Nodes, step: Step, outer: dict[str, str], state: dict[str, str],
                order: str, next_token: str, n_open: str, const: dict[str, str]
                ) -> dict[str, str]:
    """The carried values of the next step but out/out_scores: sentences with K finished
    hypotheses are dropped (only in steps where one is), the others' beams follow their
    chosen rows (`order`, (N, K))."""
    zero, one, count = const["zero"], const["one"], state["count"]
    some_done = n.op("Greater", n.op("ReduceMax", n.op("Cast", n.op(
        "GreaterOrEqual", count, outer["beams"]), to=INT64), keepdims=0), zero)

    # An If copies every value it returns, so its branches pick only small index tensors; the
    # caches, the cross-attention keys and values and the mask are gathered outside it.
    def picked(b: Nodes, rows: str, kept: str, tokens: str,
               small: dict[str, str]) -> onnx.GraphProto:
        return branch(b, {
            "rows": (b.op("Reshape", rows, b.const(INT64, [-1])), INT64),
            "kept": (kept, INT64),
            "tokens": (b.op("Reshape", tokens, b.const(INT64, [-1, 1])), INT32),
            **{k: (v, step.types[k]) for k, v in small.items()}})

    small = ("sents", "scores", "best", "count")
    drop = Nodes(step.prefix + "drop/")
    still_open = drop.op("Less", count, outer["beams"])                      # (N,)
    dropped = picked(drop, drop.op("Compress", order, still_open, axis=0),
                     drop.op("Reshape", drop.op("NonZero", still_open), drop.const(INT64, [-1])),
                     drop.op("Compress", next_token, still_open, axis=0),
                     {k: drop.op("Compress", state[k], still_open, axis=0) for k in small})
    same = Nodes(step.prefix + "same/")
    same_set = picked(same, order, same.op("Range", zero, same.op("Squeeze", n_open), one),
                      next_token, {k: same.op("Identity", state[k]) for k in small})
    labels = ["rows", "kept", "tokens", *small]
    chosen = dict(zip(labels, n.ops("If", [some_done], len(labels), then_branch=dropped,
                                    else_branch=same_set)))
    return {
        **{k: chosen[k] for k in ("tokens", *small)},
        "history": n.op("Concat", n.op("Gather", step.names["history"], chosen["rows"], axis=0),
                        chosen["tokens"], axis=1),
        **{s: n.op("Gather", state[s], chosen["rows"], axis=0) for s in step.selfs},
        **{k: n.op("Gather", state[k], chosen["kept"], axis=0)
           for k in ("mask", *step.crosses)},
    }


def _cross_input(decoder: onnx.GraphProto) -> tuple[int, int, int]:
    """(heads, d_head, element type) of the decoder's cross-attention inputs (B, H, S, dh)."""
    tensor = next(v for v in decoder.input if "_cross_" in v.name).type.tensor_type
    return tensor.shape.dim[1].dim_value, tensor.shape.dim[3].dim_value, tensor.elem_type


def _queries_per_sentence(n: Nodes, nodes: list[onnx.NodeProto], cross: set[str],
                          n_open: str, width: int) -> list[onnx.NodeProto]:
    """`nodes` with each cross-attention (a MultiHeadAttention reading keys in `cross`) taking
    its queries as (N, K, D), a sentence's K beams in a row, over keys and values of N
    sentences: beams share their sentence's keys, so nothing is copied per beam and each
    (sentence, head) is one product instead of K. Reshape nodes go to `n`, before `nodes`."""
    by_sentence = n.op("Concat", n_open, n.const(INT64, [-1, width]), axis=0)
    by_row = n.const(INT64, [-1, 1, width])
    rewritten = []
    for node in nodes:
        if node.op_type == "MultiHeadAttention" and len(node.input) > 1 \
                and node.input[1] in cross:
            query, output = node.input[0], node.output[0]
            node.input[0] = f"{query}_per_sentence"
            node.output[0] = f"{output}_per_sentence"
            rewritten += [helper.make_node("Reshape", [query, by_sentence], [node.input[0]]),
                          node,
                          helper.make_node("Reshape", [node.output[0], by_row], [output])]
        else:
            rewritten.append(node)
    return rewritten


def _greedy_body(decoder: onnx.GraphProto, n_layers: int, vocab: int, keep: set[str],
                 outer: dict[str, str]) -> onnx.GraphProto:
    """One greedy step for the sentences still open (one row each): beam search's one-beam
    case without its candidate lists and beam bookkeeping; `scores` carries each row's sum of
    log-probabilities. A sentence whose best token is EOS is written out, with its score, and
    dropped; EOS banned (before min_length) passes the turn to the second best. `outer`:
    max_new (1,), min_length and length_penalty (scalars), score_rows (1,): 1 to sum the
    log-probabilities, 0 to leave the scores at 0."""
    p = "greedy_step/"
    step = Step(decoder, n_layers, keep, p,
                ["sents", "tokens", "scores", "history", "out", "out_scores"])
    selfs, crosses, names, produced = step.selfs, step.crosses, step.names, step.produced
    n = Nodes(p)
    n.nodes.extend(step.nodes)
    it = step.iteration
    zero, one = n.const(INT64, [0], []), n.const(INT64, [1], [])
    axis_1, eos = n.const(INT64, [1]), n.const(INT64, [EOS], [])

    logits = n.op("Squeeze", produced["logits"], axis_1)                      # (N, V)
    length = n.op("Add", it, one)  # generated tokens including this one
    token = best_token(n, logits, vocab, n.op("Less", length, outer["min_length"]))  # (N,)
    scores = n.op("Add", names["scores"], _token_logp(n, logits, token, outer["score_rows"]))
    is_eos = n.op("Equal", token, eos)
    some_done = n.op("Greater", n.op("ReduceMax", n.op("Cast", is_eos, to=INT64),
                                     keepdims=0), zero)

    # Sentences that end write their tokens so far and leave (only in steps where one ends;
    # an If copies what it returns, so it returns only small tensors).
    done = Nodes(p + "done/")
    going_on = done.op("Not", is_eos)
    penalty = done.op("Pow", done.op("Cast", length, to=FLOAT), outer["length_penalty"])
    ended = branch(done, {
        "out": (write_best(done, names["out"], names["sents"], names["history"], is_eos, it,
                           outer["max_new"]), INT32),
        "out_scores": (write_score(done, names["out_scores"], names["sents"],
                                   done.op("Div", scores, penalty), is_eos), FLOAT),
        "rows": (done.op("Reshape", done.op("NonZero", going_on), done.const(INT64, [-1])),
                 INT64),
        "sents": (done.op("Compress", names["sents"], going_on, axis=0), INT64),
        "tokens": (done.op("Compress", token, going_on, axis=0), INT64),
        "scores": (done.op("Compress", scores, going_on, axis=0), FLOAT)})
    same = Nodes(p + "same/")
    unchanged = branch(same, {
        "out": (same.op("Identity", names["out"]), INT32),
        "out_scores": (same.op("Identity", names["out_scores"]), FLOAT),
        "rows": (same.op("Range", zero, same.op("Size", names["sents"]), one), INT64),
        "sents": (same.op("Identity", names["sents"]), INT64),
        "tokens": (same.op("Identity", token), INT64),
        "scores": (same.op("Identity", scores), FLOAT)})
    labels = ["out", "out_scores", "rows", "sents", "tokens", "scores"]
    chosen = dict(zip(labels, n.ops("If", [some_done], len(labels), then_branch=ended,
                                    else_branch=unchanged)))
    tokens = n.op("Unsqueeze", n.op("Cast", chosen["tokens"], to=INT32), axis_1)  # (N', 1)
    outputs = {
        "sents": chosen["sents"], "tokens": tokens, "out": chosen["out"],
        "out_scores": chosen["out_scores"], "scores": chosen["scores"],
        "history": n.op("Concat", n.op("Gather", names["history"], chosen["rows"], axis=0),
                        tokens, axis=1),
        **{s: n.op("Gather", produced[s.replace("past_", "present_")], chosen["rows"], axis=0)
           for s in selfs},
        **{k: n.op("Gather", names[k], chosen["rows"], axis=0) for k in (*crosses, "mask")},
    }
    go_on = n.op("Greater", n.op("Size", outputs["sents"]), zero)
    return step.graph(n.nodes, "greedy_step", go_on, outputs)


def block_width(vocab: int) -> int | None:
    """The block `best_token` and `top_candidates` split a row of `vocab` logits into: the
    divisor of `vocab` nearest 128 within [8, 512], two blocks or more (None: there is none,
    a plain TopK is used)."""
    divisors = [b for b in range(8, min(512, vocab // 2) + 1) if vocab % b == 0]
    return min(divisors, key=lambda b: (abs(b - 128), b)) if divisors else None


def best_token(n: Nodes, logits: str, vocab: int, eos_banned: str) -> str:
    """Each row's best token (N,) of `logits` (N, V), the first among equals; where the bool
    scalar `eos_banned` holds, the best but EOS.

    ONNX Runtime's TopK and ArgMax read a row one element at a time, its ReduceMax in vector
    registers, several times faster on a batch's rows (docs/engines.md). So each row is cut
    into blocks of `block_width` logits: the block maxima by ReduceMax, the best block by ArgMax
    over those (V / width of them), the best token by ArgMax within that block. The block that
    holds EOS is also taken on its own, with EOS at -inf where banned, for its maximum and its
    search."""
    width = block_width(vocab)
    if width is None:
        best_two = n.ops("TopK", [logits, n.const(INT64, [2])], 2, axis=1)[1]     # (N, 2)
        first = n.op("Gather", best_two, n.const(INT64, [0], []), axis=1)
        second = n.op("Gather", best_two, n.const(INT64, [1], []), axis=1)
        eos_first = n.op("Equal", first, n.const(INT64, [EOS], []))
        return n.op("Where", n.op("And", eos_banned, eos_first), second, first)
    axis_1, block_of_eos = n.const(INT64, [1]), EOS // width
    maxima, eos_block, _, by_block = _block_maxima(n, logits, vocab, width, eos_banned)
    best_block = n.op("ArgMax", maxima, axis=1, keepdims=1)                     # (N, 1)
    picked = n.op("GatherElements", by_block, n.op("Expand", n.op(
        "Unsqueeze", best_block, n.const(INT64, [2])), n.const(INT64, [1, 1, width])), axis=1)
    in_block = n.op("Where", n.op("Equal", best_block, n.const(INT64, [block_of_eos], [])),
                    eos_block, n.op("Squeeze", picked, axis_1))                 # (N, w)
    token = n.op("Add", n.op("Mul", best_block, n.const(INT64, [width], [])),
                 n.op("ArgMax", in_block, axis=1, keepdims=1))                  # (N, 1)
    return n.op("Squeeze", token, axis_1)


def _block_maxima(n: Nodes, rows: str, vocab: int, width: int, banned: str
                  ) -> tuple[str, str, str, str]:
    """The maximum of each block of `width` in each row of `rows` (R, V), EOS at -inf where the
    bool scalar `banned` holds: (R, V/w); with the block that holds EOS, so banned, (R, w),
    the ban added to it (w,): -inf at EOS or all 0, and `rows` as blocks (R, V/w, w)."""
    blocks, block_of_eos = vocab // width, EOS // width
    axis_1 = n.const(INT64, [1])
    ban = _eos_ban(n, banned, width)
    by_block = n.op("Reshape", rows, n.const(INT64, [-1, blocks, width]))
    maxima = n.op("ReduceMax", by_block, n.const(INT64, [2]), keepdims=0)
    eos_block = n.op("Add", n.op("Slice", rows, n.const(INT64, [block_of_eos * width]),
                                 n.const(INT64, [block_of_eos * width + width]), axis_1), ban)
    maxima = n.op("Concat", n.op("Slice", maxima, n.const(INT64, [0]),
                                 n.const(INT64, [block_of_eos]), axis_1),
                  n.op("ReduceMax", eos_block, axis_1, keepdims=1),
                  n.op("Slice", maxima, n.const(INT64, [block_of_eos + 1]),
                       n.const(INT64, [blocks]), axis_1), axis=1)
    return maxima, eos_block, ban, by_block


def _eos_ban(n: Nodes, banned: str, width: int) -> str:
    """What to add to a block of `width` logits that holds EOS (a whole row where `width` is
    the vocabulary): -inf at EOS where the bool scalar `banned` holds, else 0 (w,)."""
    return n.op("Where", banned,
                n.const(FLOAT, [float("-inf") if i == EOS % width else 0.0 for i in range(width)]),
                n.const(FLOAT, [0.0] * width))


def _token_logp(n: Nodes, logits: str, token: str, score_rows: str) -> str:
    """log p(token) of each row (N,), or zeros where `score_rows` (1,) is 0: the LogSoftmax
    then runs on no rows: a greedy step has no other use for log-probabilities (what they
    cost: docs/serving.md)."""
    zero_1, axis_1 = n.const(INT64, [0]), n.const(INT64, [1])
    rows = n.op("Shape", logits, start=0, end=1)                              # (1,) N
    scored = n.op("Mul", rows, score_rows)                                    # (1,) N or 0
    logp = n.op("LogSoftmax", n.op("Slice", logits, zero_1, scored, zero_1), axis=-1)
    picked = n.op("GatherElements", logp, n.op("Unsqueeze", n.op(
        "Slice", token, zero_1, scored, zero_1), axis_1), axis=1)             # (N or 0, 1)
    return n.op("Pad", n.op("Squeeze", picked, axis_1),
                n.op("Concat", zero_1, n.op("Sub", rows, scored), axis=0))   # (N,)


def write_best(n: Nodes, out: str, sents: str, hypothesis: str, better: str, length: str,
               max_new: str) -> str:
    """out[sents[i]] = hypothesis[i] padded with PAD where better[i]; `length` (scalar) is the
    hypotheses' length."""
    missing = n.op("Sub", max_new, n.op("Unsqueeze", length, n.const(INT64, [0])))
    pads = n.op("Concat", n.const(INT64, [0, 0, 0]), missing, axis=0)
    padded = n.op("Pad", hypothesis, pads, n.const(INT32, [PAD], []))         # (N, M)
    old = n.op("Gather", out, sents, axis=0)
    rows = n.op("Where", n.op("Unsqueeze", better, n.const(INT64, [1])), padded, old)
    return n.op("ScatterND", out, n.op("Unsqueeze", sents, n.const(INT64, [1])), rows)


def write_score(n: Nodes, out_scores: str, sents: str, score: str, better: str) -> str:
    """out_scores[sents[i]] = score[i] where better[i]."""
    old = n.op("Gather", out_scores, sents, axis=0)
    return n.op("ScatterND", out_scores, n.op("Unsqueeze", sents, n.const(INT64, [1])),
                n.op("Where", better, score, old))


def _setup(encoder: onnx.GraphProto, decoder: onnx.GraphProto, n_layers: int, keep: set[str],
           inputs: dict[str, str], skip: str, greedy: bool, pre: str
           ) -> tuple[onnx.NodeProto, dict[str, str], dict[str, str]]:
    """The If that encodes the batch and makes the Loop's start values (one row per sentence),
    or, where `skip` holds, small dummies instead; with the names it exposes and the outer
    values the body reads (max_new, min_length, length_penalty; greedy: score_rows; beam:
    the beam counts)."""
    selfs, crosses = _state_names(n_layers)
    mask = f"{pre}attention_mask"
    encode_nodes, encoded = inline(encoder, f"{pre}encode/", {
        "encoder_input_ids": inputs["input_ids"], "encoder_attention_mask": mask}, keep)
    heads, d_head, float_type = _cross_input(decoder)
    n = Nodes(pre)
    is_pad = n.op("Equal", inputs["input_ids"], n.const(INT32, [PAD], []))
    n.op("Cast", n.op("Not", is_pad), to=INT32, out=mask)
    n.nodes.extend(encode_nodes)
    zero, one = n.const(INT64, [0], []), n.const(INT64, [1], [])
    zero_1, one_1 = n.const(INT64, [0]), n.const(INT64, [1])

    batch_1 = n.op("Shape", inputs["input_ids"], start=0, end=1)                      # (1,)
    batch = n.op("Squeeze", batch_1)
    outer = {
        "max_new": n.op("Sub", n.op("Cast", inputs["max_length"], to=INT64), one_1),  # (1,)
        "min_length": n.op("Squeeze", n.op("Cast", inputs["min_length"], to=INT64)),
        "length_penalty": n.op("Squeeze", inputs["length_penalty"]),
    }
    if greedy:  # 1: each row's log-probabilities are summed into its score; 0: not
        outer["score_rows"] = n.op("Cast", n.op("Greater", inputs["return_scores"],
                                                n.const(INT32, [0])), to=INT64)  # (1,)
    else:
        beams_1 = n.op("Cast", inputs["num_beams"], to=INT64)                         # (1,)
        beams = n.op("Squeeze", beams_1)
        two_beams = n.op("Add", beams_1, beams_1)
        outer.update({
            "beams": beams, "beams_1": beams_1, "two_beams": two_beams,
            "returns_1": n.op("Cast", inputs["num_return_sequences"], to=INT64),     # (1,)
            "first_beams": n.op("Less", n.op("Range", zero, n.op("Squeeze", two_beams), one),
                                beams)})

    # One row per sentence until the first step has chosen each sentence's K beams.
    cross_values = [encoded[c.replace("past_", "present_")] for c in crosses]
    tokens = n.op("Expand", n.const(INT32, [BOS], [1, 1]),
                  n.op("Concat", batch_1, one_1, axis=0))                     # (B, 1)
    history = n.op("ConstantOfShape", n.op("Concat", batch_1, zero_1, axis=0),
                   value=helper.make_tensor("v", INT32, [1], [PAD]))          # (B, 0)
    empty_cache = n.op("ConstantOfShape", n.op("Concat", batch_1,
                                                n.const(INT64, [heads, 0, d_head]), axis=0),
                       value=helper.make_tensor("v", float_type, [1], [0]))
    sents = n.op("Range", zero, batch, one)
    trip = n.op("Squeeze", outer["max_new"])
    start = n.op("Greater", trip, zero)
    # The Loop's start values and the body's outer values come out of an If, so that when
    # `skip` holds (another search takes this batch) none of the above runs.
    # name: (value, type, the skipped path's dims and values)
    starts = {"trip": (trip, INT64, [], [0]), "start": (start, BOOL, [], [False]),
              "sents": (sents, INT64, [0], []), "tokens": (tokens, INT32, [0, 1], [])}
    starts.update(_result_starts(n, batch_1, one_1, outer["max_new"], outer.get("returns_1")))
    starts.update({
        "history": (history, INT32, [0, 0], []),
        "empty_cache": (empty_cache, float_type, [0, heads, 0, d_head], []),
        **{c: (v, float_type, [0, heads, 1, d_head], []) for c, v in zip(crosses, cross_values)},
        "mask": (mask, INT32, [0, 1], []), "batch_1": (batch_1, INT64, [1], [0]),
        "max_new": (outer["max_new"], INT64, [1], [0]),
        "min_length": (outer["min_length"], INT64, [], [0]),
        "length_penalty": (outer["length_penalty"], FLOAT, [], [1.0])})
    if greedy:
        starts["score_rows"] = (outer["score_rows"], INT64, [1], [1])
    else:
        starts.update({
            "beams": (beams, INT64, [], [1]), "beams_1": (beams_1, INT64, [1], [1]),
            "two_beams": (two_beams, INT64, [1], [2]),
            "returns_1": (outer["returns_1"], INT64, [1], [1]),
            "first_beams": (outer["first_beams"], BOOL, [2], [True, False])})
    setup, exposed = _skippable(n.nodes, starts, skip, pre)
    return setup, exposed, {k: exposed[k] for k in outer}


def _result_starts(n: Nodes, batch_1: str, one_1: str, max_new: str, returns_1: str | None
                   ) -> dict[str, tuple]:
    """The start values of the scores and results: greedy (`returns_1` None), a row's sum of
    log-probabilities (B,), each sentence's tokens `out` (B, M) and score `out_scores` (B,);
    beam search (`returns_1`: [N]), the beams' scores (B, 1), each sentence's N best finished
    scores `best` (B, N), their tokens and scores (B, N, M) and (B, N), its count of finished."""
    per_sentence = batch_1 if returns_1 is None else n.op("Concat", batch_1, returns_1, axis=0)
    dims = [0] if returns_1 is None else [0, 1]  # the skipped path's
    starts = {
        "out": (n.op("ConstantOfShape", n.op("Concat", per_sentence, max_new, axis=0),
                     value=helper.make_tensor("v", INT32, [1], [PAD])), INT32, [*dims, 0], []),
        "out_scores": (n.op("ConstantOfShape", per_sentence, value=helper.make_tensor(
            "v", FLOAT, [1], [float("-inf")])), FLOAT, dims, [])}
    if returns_1 is None:
        starts["scores"] = (n.op("ConstantOfShape", batch_1, value=helper.make_tensor(
            "v", FLOAT, [1], [0.0])), FLOAT, [0], [])
        return starts
    return {
        **starts,
        "scores": (n.op("ConstantOfShape", n.op("Concat", batch_1, one_1, axis=0),
                        value=helper.make_tensor("v", FLOAT, [1], [0.0])),  # (B, 1)
                   FLOAT, [0, 1], []),
        "best": (n.op("ConstantOfShape", per_sentence,
                      value=helper.make_tensor("v", FLOAT, [1], [float("-inf")])),
                 FLOAT, [0, 1], []),
        "count": (n.op("ConstantOfShape", batch_1,
                       value=helper.make_tensor("v", INT64, [1], [0])), INT64, [0], [])}


def _skippable(nodes: list[onnx.NodeProto], starts: dict[str, tuple], skip: str, pre: str
               ) -> tuple[onnx.NodeProto, dict[str, str]]:
    """An If that runs `nodes` and returns the `starts` values, or, where `skip` holds, small
    constants of their types (name: (value, type, the skipped path's dims and values)); and
    the names it returns them under."""
    exposed = {k: f"{pre}{k}" for k in starts}
    dummies = [helper.make_node("Constant", [], [f"{pre}dummy_{k}"], value=helper.make_tensor(
        f"dummy_{k}", dtype, dims, values)) for k, (_, dtype, dims, values) in starts.items()]
    tag = pre.strip("/")
    setup = helper.make_node(
        "If", [skip], list(exposed.values()),
        then_branch=helper.make_graph(dummies, f"{tag}_skipped", [], [
            helper.make_tensor_value_info(f"{pre}dummy_{k}", dtype, None)
            for k, (_, dtype, _, _) in starts.items()]),
        else_branch=helper.make_graph(nodes, f"{tag}_setup", [], [
            helper.make_tensor_value_info(name, dtype, None)
            for name, dtype, _, _ in starts.values()]))
    return setup, exposed


def search_nodes(encoder: onnx.GraphProto, decoder: onnx.GraphProto, n_layers: int,
                 keep: set[str], inputs: dict[str, str], outputs: tuple[str, str], skip: str,
                 skipped: tuple[str, str], greedy: bool = False) -> list[onnx.NodeProto]:
    """Nodes of the outer graph from `inputs` (input_ids, max_length, min_length, num_beams,
    length_penalty, return_scores -> the names to read) to `outputs` (sequences,
    sequences_scores); `keep` names the weights (outer initializers). Where the bool scalar
    `skip` holds, nothing runs but a Loop of no step and `outputs` are `skipped`. `greedy`:
    the one-beam search (`_greedy_body`), which does not read num_beams."""
    pre = "greedy/" if greedy else "search/"
    selfs, crosses = _state_names(n_layers)
    setup, exposed, outer = _setup(encoder, decoder, n_layers, keep, inputs, skip, greedy, pre)
    small = ["sents", "tokens", "scores", "history"] \
        + ([] if greedy else ["best", "count"]) + ["out", "out_scores"]
    vocab = next(o for o in decoder.output if o.name == "logits").type.tensor_type.shape.dim[2]
    body = (_greedy_body(decoder, n_layers, vocab.dim_value, keep, outer) if greedy
            else _body(decoder, n_layers, vocab.dim_value, keep, outer))
    ends = [f"{pre}end_{c}" for c in (*small, *selfs, *crosses, "mask")]
    loop = helper.make_node(
        "Loop", [exposed[k] for k in ("trip", "start", *small)]
        + [exposed["empty_cache"]] * len(selfs) + [exposed[c] for c in crosses]
        + [exposed["mask"]], ends, body=body)
    end = dict(zip(small, ends))
    finish = _finish(end, exposed["batch_1"], outer, outputs, skip, skipped, greedy, pre)
    return [setup, loop, finish]


def _open_at_limit(n: Nodes, end: dict[str, str], penalty: str, steps: str,
                   outer: dict[str, str], pre: str) -> tuple[str, str]:
    """The beam search's results (out, out_scores) once the sentences still open at the length
    limit have let their live beams compete with their finished ones. An If skips that when
    none is open (every sentence ended before the limit): onnxruntime-web's TopK traps with
    "divide by zero" on a tensor of no rows, where native ONNX Runtime returns an empty one
    (docs/web.md)."""
    o = Nodes(f"{pre}final/open/")
    live = o.op("Div", end["scores"], penalty)                                # (N, 1 or K)
    beams_now = o.op("Shape", end["scores"], start=1, end=2)                  # [1 or K]
    live_hypotheses = o.op("Reshape", end["history"], o.op(
        "Concat", o.op("Shape", end["sents"]), beams_now,
        o.op("Unsqueeze", steps, o.const(INT64, [0])), axis=0))               # (N, 1 or K, t)
    names = {"best": end["best"], "out": end["out"], "out_scores": end["out_scores"],
             "sents": end["sents"]}
    _, final, final_scores = keep_best(o, names, live, live_hypotheses, steps, outer)
    ended = Nodes(f"{pre}final/ended/")
    as_they_are = {k: (ended.op("Identity", end[k]), t)
                   for k, t in (("out", INT32), ("out_scores", FLOAT))}
    some_open = n.op("Greater", n.op("Size", end["sents"]), n.const(INT64, [0], []))
    final, final_scores = n.ops("If", [some_open], 2,
                                then_branch=branch(o, {"out": (final, INT32),
                                                       "out_scores": (final_scores, FLOAT)}),
                                else_branch=branch(ended, as_they_are))
    return final, final_scores


def _finish(end: dict[str, str], batch_1: str, outer: dict[str, str], outputs: tuple[str, str],
            skip: str, skipped: tuple[str, str], greedy: bool, pre: str) -> onnx.NodeProto:
    """The If that writes `outputs` (sequences, sequences_scores) from the Loop's `end`
    values, or passes `skipped` through where `skip` holds."""
    tag = pre.strip("/")
    # At the length limit, the open sentences' live beams compete with their finished ones
    # (greedy: each open sentence's one hypothesis is its result).
    n = Nodes(f"{pre}final/")
    zero_1, one_1 = n.const(INT64, [0]), n.const(INT64, [1])
    steps = n.op("Squeeze", n.op("Shape", end["history"], start=1, end=2))
    # a hypothesis cut at the limit counts its tokens + 1, as one that ends counts its EOS (and
    # as ONNX Runtime's operator, which searches one sentence, counts its BOS)
    penalty = n.op("Pow", n.op("Cast", n.op("Add", steps, n.const(INT64, [1], [])), to=FLOAT),
                   outer["length_penalty"])
    if greedy:
        better = n.op("ConstantOfShape", n.op("Shape", end["sents"]),
                      value=helper.make_tensor("v", BOOL, [1], [True]))
        live_best = n.op("Div", end["scores"], penalty)                       # (N,)
        final = write_best(n, end["out"], end["sents"], end["history"], better, steps,
                           outer["max_new"])
        final_scores = n.op("Unsqueeze", write_score(n, end["out_scores"], end["sents"],
                                                     live_best, better), one_1)  # (B, 1)
        final = n.op("Unsqueeze", final, one_1)                               # (B, 1, M)
        bos_shape = n.op("Concat", batch_1, one_1, one_1, axis=0)             # [B, 1, 1]
    else:
        final, final_scores = _open_at_limit(n, end, penalty, steps, outer, pre)
        bos_shape = n.op("Concat", batch_1, outer["returns_1"], one_1, axis=0)  # [B, N, 1]
    written = n.op("Slice", final, zero_1, n.op("Unsqueeze", steps, zero_1),
                   n.const(INT64, [2]))                                       # (B, N, t)
    bos = n.op("Expand", n.const(INT32, [BOS], [1, 1, 1]), bos_shape)
    searched = n.op("Concat", bos, written, axis=2)                           # (B, N, T)
    scored = final_scores                                                     # (B, N)
    passed = [helper.make_node("Identity", [given], [f"{pre}final/skipped_{i}"])
              for i, given in enumerate(skipped)]
    finish = helper.make_node(
        "If", [skip], list(outputs),
        then_branch=helper.make_graph(passed, f"{tag}_not_run", [], [
            helper.make_tensor_value_info(f"{pre}final/skipped_{i}", dtype, None)
            for i, dtype in enumerate((INT32, FLOAT))]),
        else_branch=helper.make_graph(n.nodes, f"{tag}_final", [], [
            helper.make_tensor_value_info(searched, INT32, None),
            helper.make_tensor_value_info(scored, FLOAT, None)]))
    return finish
