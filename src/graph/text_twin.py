"""Text in, text out: the generation model with SentencePiece inside the graph.

`wrap` turns a model written by `onnx_graph.build` into one that takes a batch of strings and
returns strings, so a C#, Java, C++ or JavaScript program translates with ONNX Runtime, the
onnxruntime-extensions library and this one file (no Python, no separate tokenizer):

    text                  string (B,)   sentences; a blank one comes back blank
    num_beams             int32 (1,)    optional (left out: the file's beam)
    length_penalty        float (1,)    optional (left out: the file's)
    num_return_sequences  int32 (1,)    optional (left out: 1): hypotheses per sentence, 1 to
                                        the beam
    -> translation        string (B,)   the best translation of each sentence
    -> score              float (B,)    its search score (a blank line's means nothing)
    -> translations       string (B, N) the n-best list, best first (N = num_return_sequences)
    -> scores             float (B, N)  their scores

Left out, the search is the one the file was written with (metadata `beam_size`,
`length_penalty`); the output length always follows `max_length_ratio`. `python -m
src.text_graph` writes a twin with other defaults, e.g. greedy.

Inside: `SentencepieceTokenizer` (ai.onnx.contrib) gives every sentence's pieces as one flat
tensor plus row offsets; plain ONNX ops cut each row to the model's source limit, append EOS
and pad it into the (B, S) `input_ids` the search expects; `max_length` follows the
`max_length_ratio` as `generation.max_new_tokens` does; after the unchanged search a
Loop runs `SentencepieceDecoder` on each row (it decodes one row per call), and special ids
decode to nothing, stray byte pieces (U+FFFD) are dropped and spaces between CJK characters
removed, as in `Translator.run` (`subword.decode_ids`).
"""

from __future__ import annotations

import base64
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from src.core.errors import PipelineError
from src.data.subword import BROKEN_BYTE, CJK_RANGES, EOS, PAD
from src.runtime.contract import (
    GRAPH_FORMAT,
    SCORE_SWITCH,
    TEXT_FORMAT,
    TEXT_INPUT,
    TEXT_N_BEST_SCORES,
    TEXT_N_BEST_TEXTS,
    TEXT_OUTPUT,
    TEXT_SCORE,
    TEXT_SOURCE_TOKENIZER,
    check_format,
)

CONTRIB_DOMAIN = "ai.onnx.contrib"  # where onnxruntime-extensions registers its operators
# the generation model's inputs a text client may still give
OPTIONAL_SEARCH_INPUTS = ("num_beams", "length_penalty", "num_return_sequences")
INT64_MAX = 2**63 - 1


def _const(name: str, dtype: int, values: list, dims: list[int] | None = None):
    return helper.make_tensor(name, dtype, [len(values)] if dims is None else dims, values)


def _encode_nodes(source_model: bytes, max_source_tokens: int, ratio: float,
                  max_output_tokens: int) -> tuple[list, list]:
    """Nodes text -> input_ids (B, S) int32 and max_length (1,) int32, and their constants."""
    consts = [
        _const("spm_nbest", TensorProto.INT64, [0]),
        _const("spm_alpha", TensorProto.FLOAT, [0.0]),
        _const("spm_false", TensorProto.BOOL, [False]),
        _const("zero_i64", TensorProto.INT64, [0], []),
        _const("one_i64", TensorProto.INT64, [1], []),
        _const("axis1", TensorProto.INT64, [1]),
        _const("slice_begin", TensorProto.INT64, [0]),
        _const("slice_last", TensorProto.INT64, [-1]),
        _const("slice_second", TensorProto.INT64, [1]),
        _const("slice_end", TensorProto.INT64, [INT64_MAX]),
        _const("pad_row", TensorProto.INT32, [PAD]),
        _const("eos_i32", TensorProto.INT32, [EOS], []),
        # the source keeps at most max_source_tokens - 1 pieces: room for the EOS
        _const("piece_limit", TensorProto.INT64, [max_source_tokens - 1], []),
        _const("length_ratio", TensorProto.DOUBLE, [ratio], []),
        _const("ten", TensorProto.INT64, [10], []),
        _const("output_limit", TensorProto.INT64, [max_output_tokens], []),
    ]
    node = helper.make_node
    nodes = [
        node("SentencepieceTokenizer",
             [TEXT_INPUT, "spm_nbest", "spm_alpha", "spm_false", "spm_false", "spm_false"],
             ["pieces", "row_offsets"], domain=CONTRIB_DOMAIN, model=source_model,
             name="SourceTokenizer"),
        node("Slice", ["row_offsets", "slice_begin", "slice_last"], ["row_starts"]),
        node("Slice", ["row_offsets", "slice_second", "slice_end"], ["row_ends"]),
        node("Sub", ["row_ends", "row_starts"], ["row_pieces"]),
        node("Min", ["row_pieces", "piece_limit"], ["row_kept"]),            # (B,)
        node("ReduceMax", ["row_kept"], ["longest_kept"], keepdims=0),
        node("Add", ["longest_kept", "one_i64"], ["source_length"]),          # S, with EOS
        node("Range", ["zero_i64", "source_length", "one_i64"], ["positions"]),  # (S,)
        node("Unsqueeze", ["row_starts", "axis1"], ["row_starts_col"]),       # (B, 1)
        node("Unsqueeze", ["row_kept", "axis1"], ["row_kept_col"]),
        node("Add", ["row_starts_col", "positions"], ["piece_index"]),        # (B, S)
        node("Less", ["positions", "row_kept_col"], ["is_piece"]),
        # positions past a row's pieces read one PAD appended after the flat pieces
        node("Shape", ["pieces"], ["piece_count"]),
        node("Where", ["is_piece", "piece_index", "piece_count"], ["safe_index"]),
        node("Concat", ["pieces", "pad_row"], ["pieces_then_pad"], axis=0),
        node("Gather", ["pieces_then_pad", "safe_index"], ["padded_pieces"]),
        node("Equal", ["positions", "row_kept_col"], ["is_eos"]),
        node("Where", ["is_eos", "eos_i32", "padded_pieces"], ["input_ids"]),
        # max_length = BOS + min(int(ratio * S) + 10, limit), as generation.max_new_tokens
        node("Cast", ["source_length"], ["source_length_f"], to=TensorProto.DOUBLE),
        node("Mul", ["source_length_f", "length_ratio"], ["scaled_length"]),
        node("Floor", ["scaled_length"], ["scaled_floor"]),
        node("Cast", ["scaled_floor"], ["scaled_int"], to=TensorProto.INT64),
        node("Add", ["scaled_int", "ten"], ["wanted_tokens"]),
        node("Min", ["wanted_tokens", "output_limit"], ["new_tokens"]),
        node("Add", ["new_tokens", "one_i64"], ["max_length_i64"]),
        node("Cast", ["max_length_i64"], ["max_length_scalar"], to=TensorProto.INT32),
        node("Unsqueeze", ["max_length_scalar", "slice_begin"], ["max_length"]),
    ]
    return nodes, consts


# subword.join_cjk in RE2, which has no lookarounds: each match consumes the character after the
# spaces, so in "我 你 他" one pass leaves the second gap; a second pass closes every gap left.
_CJK_RE2 = "[" + "".join(f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in CJK_RANGES) + "]"
SPACES_BETWEEN_CJK_RE2 = f"({_CJK_RE2}) +({_CJK_RE2})"


def join_cjk_nodes(text: str, joined: str) -> tuple[list, list]:
    """Nodes string tensor `text` -> `joined` without spaces between CJK characters."""
    consts = [_const("cjk_gap", TensorProto.STRING, [SPACES_BETWEEN_CJK_RE2.encode()], [1]),
              _const("cjk_closed", TensorProto.STRING, [rb"\1\2"], [1])]
    passes = [(text, "half_joined"), ("half_joined", joined)]
    nodes = [helper.make_node("StringRegexReplace", [source, "cjk_gap", "cjk_closed"], [target],
                              domain=CONTRIB_DOMAIN, name=f"JoinCJK{i}")
             for i, (source, target) in enumerate(passes)]
    return nodes, consts


def _decode_nodes(target_model: bytes) -> tuple[list, list]:
    """Nodes sequences (B, N, T) -> translations (B, N) strings, blank where the text was, and
    translation (B,), the first of each row."""
    consts = [_const("batch_axis", TensorProto.INT64, [0], []),
              _const("first", TensorProto.INT64, [0], []),
              _const("lists_shape_begin", TensorProto.INT64, [0]),
              _const("lists_shape_end", TensorProto.INT64, [2]),
              _const("list_axis", TensorProto.INT64, [1]),
              _const("empty_text", TensorProto.STRING, [b""], []),
              _const("no_pieces", TensorProto.INT64, [0], []),
              _const("broken_byte", TensorProto.STRING, [BROKEN_BYTE.encode()], [1]),
              _const("nothing", TensorProto.STRING, [b""], [1])]
    node = helper.make_node
    body = helper.make_graph(
        [node("Gather", ["ids_i64", "step"], ["row"], axis=0),
         node("SentencepieceDecoder", ["row"], ["row_text"], domain=CONTRIB_DOMAIN,
              model=target_model, name="TargetDecoder"),
         node("Identity", ["keep_going"], ["keep_going_out"])],
        "decode_row",
        [helper.make_tensor_value_info("step", TensorProto.INT64, []),
         helper.make_tensor_value_info("keep_going", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("keep_going_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("row_text", TensorProto.STRING, [1])])
    nodes = [
        node("Flatten", ["sequences"], ["ids_i32"], axis=2),                  # (B * N, T)
        node("Cast", ["ids_i32"], ["ids_i64"], to=TensorProto.INT64),
        node("Shape", ["ids_i64"], ["ids_shape"]),
        node("Gather", ["ids_shape", "batch_axis"], ["hypothesis_count"]),
        node("Loop", ["hypothesis_count", ""], ["row_texts"], body=body),     # (B * N, 1)
        node("Shape", ["sequences"], ["sequences_shape"]),
        node("Slice", ["sequences_shape", "lists_shape_begin", "lists_shape_end"],
             ["lists_shape"]),                                                 # (B, N)
        node("Reshape", ["row_texts", "lists_shape"], ["decoded"]),
        node("Equal", ["row_pieces", "no_pieces"], ["blank_row"]),
        node("Unsqueeze", ["blank_row", "list_axis"], ["was_blank"]),        # (B, 1)
        node("StringRegexReplace", ["decoded", "broken_byte", "nothing"], ["repaired"],
             domain=CONTRIB_DOMAIN, name="DropBrokenBytes"),  # as subword.drop_broken_bytes
    ]
    join_nodes, join_consts = join_cjk_nodes("repaired", "joined")
    nodes += join_nodes + [
        node("Where", ["was_blank", "empty_text", "joined"], [TEXT_N_BEST_TEXTS]),
        node("Gather", [TEXT_N_BEST_TEXTS, "first"], [TEXT_OUTPUT], axis=1)]
    return nodes, consts + join_consts


def wrap(generation: onnx.ModelProto, source_model: bytes, target_model: bytes,
         beam: int | None = None, length_penalty: float | None = None) -> onnx.ModelProto:
    """The text-in, text-out twin of a generation model (fp32 or int8), given the bytes of the
    SentencePiece models it was exported with (tokenizer/source.model and target.model); the
    search is the export's unless `beam` / `length_penalty` say otherwise."""
    model = onnx.ModelProto.FromString(generation.SerializeToString())  # work on a copy
    meta = {p.key: p.value for p in model.metadata_props}
    check_format(meta, "the model", (GRAPH_FORMAT,))
    meta["beam_size"] = str(beam or int(meta["beam_size"]))
    if length_penalty is not None:
        meta["length_penalty"] = str(length_penalty)
    graph = model.graph
    encode, encode_consts = _encode_nodes(
        source_model, int(meta["max_source_tokens"]), float(meta["max_length_ratio"]),
        int(meta["max_output_tokens"]))
    decode, decode_consts = _decode_nodes(target_model)
    # the search inputs a text client does not give; OPTIONAL_SEARCH_INPUTS stay inputs, these
    # values (initializers of the same names) their defaults
    search = [
        _const("num_beams", TensorProto.INT32, [int(meta["beam_size"])]),
        _const("length_penalty", TensorProto.FLOAT, [float(meta["length_penalty"])]),
        _const("min_length", TensorProto.INT32, [0]),
        _const("num_return_sequences", TensorProto.INT32, [1]),
        _const("repetition_penalty", TensorProto.FLOAT, [1.0]),
    ]
    kept = [i for i in graph.input if i.name in (SCORE_SWITCH, *OPTIONAL_SEARCH_INPUTS)]
    del graph.input[:]
    graph.input.extend([helper.make_tensor_value_info(TEXT_INPUT, TensorProto.STRING,
                                                      ["batch_size"]), *kept])
    outputs = [(TEXT_OUTPUT, TensorProto.STRING, ["batch_size"]),
               (TEXT_N_BEST_TEXTS, TensorProto.STRING, ["batch_size", "num_return_sequences"])]
    outputs[1:1] = [(TEXT_SCORE, TensorProto.FLOAT, ["batch_size"])]
    outputs.append((TEXT_N_BEST_SCORES, TensorProto.FLOAT, ["batch_size", "num_return_sequences"]))
    decode = [*decode, helper.make_node("Identity", ["sequences_scores"], [TEXT_N_BEST_SCORES]),
              helper.make_node("Gather", ["sequences_scores", "first"], [TEXT_SCORE], axis=1)]
    del graph.output[:]
    graph.output.extend([helper.make_tensor_value_info(*output) for output in outputs])
    nodes = [*encode, *graph.node, *decode]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend([*encode_consts, *decode_consts, *search])
    graph.name = "nmt text generation"
    model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    helper.set_model_props(model, {**meta, "format": TEXT_FORMAT,
                                   TEXT_SOURCE_TOKENIZER: base64.b64encode(source_model).decode()})
    return model


def wrap_file(generation_path: Path, tokenizer_dir: Path, out_path: Path,
              beam: int | None = None, length_penalty: float | None = None) -> None:
    """Read a generation model and its tokenizer; write the text model to `out_path`."""
    source, target = (Path(tokenizer_dir) / f"{side}.model" for side in ("source", "target"))
    for path in (Path(generation_path), source, target):
        if not path.is_file():
            raise PipelineError(f"not found: {path}")
    wrapped = wrap(onnx.load(str(generation_path)), source.read_bytes(), target.read_bytes(),
                   beam, length_penalty)
    onnx.save(wrapped, str(out_path))
