"""ONNX Runtime's kernels at the shapes of our decoder, on this CPU: int8 and block-quantized
MatMuls, log-probabilities, threads and the BeamSearch operator, one table each (TABLES). Each
variant's fastest of three passes counts; what the tables show: docs/engines.md, docs/serving.md,
docs/benchmarks/kernels*.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import typer
from onnx import TensorProto, helper, numpy_helper
from onnx.helper import make_node

from bench import common

app = common.cli_app()
MS = "com.microsoft"
INT32 = TensorProto.INT32


def value(name: str, shape, kind: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, kind, shape)


def constant(name: str, values, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype), name)


def serialized(nodes, name: str, inputs: list, outputs: list, initializers=()) -> bytes:
    """The model of one graph, opset 18 and Microsoft's contrib operators, as bytes."""
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)]).SerializeToString()


def one_node_model(nodes, k: int, initializers):
    """A model of `nodes` with the float input `x` of `k` columns and one float output `y`."""
    return serialized(nodes, "kernel", [value("x", ["M", k])], [value("y", None)], initializers)


def int8_weight(k: int, n: int):
    w = np.random.default_rng(0).integers(-127, 127, (k, n), dtype=np.int8)
    return [constant("w", w, np.int8), constant("w_scale", [0.01], np.float32),
            constant("w_zero", [0], np.int8)]


def dynamic(k: int, n: int) -> bytes:
    node = make_node("DynamicQuantizeMatMul", ["x", "w", "w_scale", "w_zero"], ["y"], domain=MS)
    return one_node_model([node], k, int8_weight(k, n))


def static(k: int, n: int) -> bytes:
    scale = [constant("x_scale", 0.02, np.float32), constant("x_zero", 128, np.uint8)]
    nodes = [make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
             make_node("MatMulIntegerToFloat",
                       ["xq", "w", "x_scale", "w_scale", "x_zero", "w_zero"], ["y"], domain=MS)]
    return one_node_model(nodes, k, int8_weight(k, n) + scale)


def fp32(k: int, n: int) -> bytes:
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.05
    return one_node_model([make_node("MatMul", ["x", "w"], ["y"])], k,
                          [numpy_helper.from_array(w, "w")])


def nbits(k: int, n: int, bits: int, block: int) -> bytes:
    from onnx import ModelProto
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(ModelProto.FromString(fp32(k, n)), bits=bits,
                                     block_size=block, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    return quantizer.model.model.SerializeToString()


def cpu_session(model: bytes, threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def best_of(models: dict[str, bytes], feed: dict[str, np.ndarray], calls: int,
            threads: int = 1) -> dict:
    """Microseconds per call of each model, the fastest of three passes, models in turn."""
    sessions = {name: cpu_session(model, threads) for name, model in models.items()}
    best = dict.fromkeys(sessions, float("inf"))
    for _ in range(3):
        for name, session in sessions.items():
            for _ in range(max(calls // 20, 5)):
                session.run(None, feed)
            start = time.perf_counter()
            for _ in range(calls):
                session.run(None, feed)
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return {name: round(us, 1) for name, us in best.items()}


def features(k: int, rows: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)}


def static_rows() -> list[dict]:
    shapes = ((32, 512, 512), (32, 512, 1536), (32, 512, 2048), (32, 2048, 512), (4, 512, 512))
    return [{"table": "static", "m": m, "k": k, "n": n,
             "us": best_of({"dynamic": dynamic(k, n), "static": static(k, n)},
                           features(k, m), 1000)} for m, k, n in shapes]


def nbits_rows() -> list[dict]:
    rows = []
    for k, n in ((256, 768), (256, 1024), (1024, 256), (256, 8000)):
        models = {"dynamic": dynamic(k, n), "nbits8_b32": nbits(k, n, 8, 32),
                  "nbits8_b128": nbits(k, n, 8, 128), "nbits4_b32": nbits(k, n, 4, 32)}
        for m in (1, 32):
            rows.append({"table": "nbits", "m": m, "k": k, "n": n,
                         "us": best_of(models, features(k, m), 1000 if m == 1 else 300)})
    return rows


def logp_rows(vocab: int = 8000, rows: int = 32) -> list[dict]:
    pick = make_node("GatherElements", ["x", "i"], ["g"], axis=1)
    graphs = {
        "logsoftmax": [make_node("LogSoftmax", ["x"], ["l"], axis=-1),
                       make_node("GatherElements", ["l", "i"], ["y"], axis=1)],
        "softmax_log": [make_node("Softmax", ["x"], ["p"], axis=-1),
                        make_node("GatherElements", ["p", "i"], ["q"], axis=1),
                        make_node("Log", ["q"], ["y"])],
        "reduce_logsumexp": [make_node("ReduceLogSumExp", ["x", "axis"], ["n"], keepdims=1),
                             pick, make_node("Sub", ["g", "n"], ["y"])],
        "max_exp_sum": [make_node("ReduceMax", ["x", "axis"], ["m"], keepdims=1),
                        make_node("Sub", ["x", "m"], ["d"]), make_node("Exp", ["d"], ["e"]),
                        make_node("ReduceSum", ["e", "axis"], ["s"], keepdims=1),
                        make_node("Log", ["s"], ["n"]), pick,
                        make_node("Sub", ["g", "m"], ["gm"]),
                        make_node("Sub", ["gm", "n"], ["y"])],
        # -log p of a given label in one op, the normaliser inside it
        "softmax_cross_entropy": [
            make_node("Squeeze", ["i", "axis"], ["label"]),
            make_node("SoftmaxCrossEntropyLoss", ["x", "label"], ["nll"], reduction="none"),
            make_node("Neg", ["nll"], ["p"]), make_node("Unsqueeze", ["p", "axis"], ["y"])]}
    models = {name: serialized(nodes, name, [value("x", ["M", vocab]),
                                             value("i", ["M", 1], TensorProto.INT64)],
                               [value("y", None)], [constant("axis", [1])]
                               if "axis" in {i for n in nodes for i in n.input} else [])
              for name, nodes in graphs.items()}
    logits = features(vocab, rows)["x"] * 4  # spread like a trained model's logits
    feed = {"x": logits, "i": logits.argmax(axis=1, keepdims=True).astype(np.int64)}
    outputs = {name: cpu_session(model).run(None, feed)[0] for name, model in models.items()}
    return [{"table": "logp", "m": rows, "n": vocab, "us": best_of(models, feed, 2000),
             "max_abs_diff": {name: float(np.abs(out - outputs["logsoftmax"]).max())
                              for name, out in outputs.items()}}]


PRODUCTS = 20  # per call in `threads_rows`


def repeated_products(k: int, n: int) -> bytes:
    """PRODUCTS fp32 MatMuls of one (k, n) weight, each reading the input: (M, k) -> (M, n)."""
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.05
    nodes = [make_node("MatMul", ["x", "w"], [f"y{i}"]) for i in range(PRODUCTS)]
    return serialized(nodes, "products", [value("x", ["M", k])],
                      [value(f"y{i}", None) for i in range(PRODUCTS)],
                      [numpy_helper.from_array(w, "w")])


def threads_rows() -> list[dict]:
    """µs per product (PRODUCTS products per call) at 1 and 4 rows, on one thread and on two."""
    rows = []
    for k, n in ((256, 256), (256, 768), (256, 1024), (1024, 256), (256, 8000)):
        model = {"fp32": repeated_products(k, n)}
        for m in (1, 4):
            us = {f"{t}t": round(best_of(model, features(k, m), 200, threads=t)["fp32"]
                                 / PRODUCTS, 2) for t in (1, 2)}
            rows.append({"table": "threads", "m": m, "k": k, "n": n, "us": us})
    return rows


def idle_search(vocab: int = 8000, heads: int = 4, head_dim: int = 64,
                layers: int = 3) -> bytes:
    """ONNX Runtime's BeamSearch around an encoder and decoder that do almost nothing: the
    decoder's logits are a constant in which EOS (3) is never chosen, its self-attention caches
    grow by a zero row per step and the encoder's cross caches are zeros, so a search runs to
    max_length and its time is the operator's own."""
    zeros = numpy_helper.from_array(np.zeros((1, heads, 1, head_dim), np.float32), "zeros")
    dims = [constant(name, [size]) for name, size in (
        ("first", 0), ("second", 1), ("one", 1), ("heads", heads), ("head_dim", head_dim),
        ("vocab", vocab))]
    cross = [f"{kv}_cross_{i}" for i in range(layers) for kv in ("key", "value")]
    own = [name.replace("_cross_", "_self_") for name in cross]
    encoder = helper.make_graph(
        [make_node("Shape", ["encoder_input_ids"], ["shape"]),
         make_node("Gather", ["shape", "first"], ["rows"], axis=0),
         make_node("Gather", ["shape", "second"], ["length"], axis=0),
         make_node("Concat", ["rows", "heads", "length", "head_dim"], ["cache_shape"], axis=0),
         *[make_node("Expand", ["zeros", "cache_shape"], [f"present_{c}"]) for c in cross]],
        "encoder", [value("encoder_input_ids", ["B", "S"], INT32),
                    value("encoder_attention_mask", ["B", "S"], INT32)],
        [value(f"present_{c}", ["B", heads, "S", head_dim]) for c in cross], [zeros, *dims])
    logits = np.random.default_rng(0).standard_normal((1, 1, vocab)).astype(np.float32)
    logits[0, 0, 3] = -1e4
    decoder = helper.make_graph(
        [make_node("Shape", ["input_ids"], ["shape"]),
         make_node("Gather", ["shape", "first"], ["rows"], axis=0),
         make_node("Concat", ["rows", "one", "vocab"], ["logits_shape"], axis=0),
         make_node("Expand", ["constant_logits", "logits_shape"], ["logits"]),
         make_node("Concat", ["rows", "heads", "one", "head_dim"], ["row_shape"], axis=0),
         make_node("Expand", ["zeros", "row_shape"], ["new_row"]),
         *[make_node("Concat", [f"past_{c}", "new_row"], [f"present_{c}"], axis=2)
           for c in own]],
        "decoder",
        [value("input_ids", ["B", 1], INT32), value("encoder_attention_mask", ["B", "S"], INT32),
         *[value(f"past_{c}", ["B", heads, "T", head_dim]) for c in own],
         *[value(f"past_{c}", ["B", heads, "S", head_dim]) for c in cross]],
        [value("logits", ["B", 1, vocab]),
         *[value(f"present_{c}", ["B", heads, "T1", head_dim]) for c in own]],
        [zeros, *dims, numpy_helper.from_array(logits, "constant_logits")])
    counts = ("max_length", "min_length", "num_beams", "num_return_sequences")
    search = make_node("BeamSearch", ["input_ids", *counts, "length_penalty",
                                      "repetition_penalty", "", "", "attention_mask"],
                       ["sequences"], domain=MS, eos_token_id=3, pad_token_id=0,
                       decoder_start_token_id=2, no_repeat_ngram_size=0, early_stopping=1,
                       model_type=1, encoder=encoder, decoder=decoder)
    return serialized(
        [search], "idle_search",
        [value("input_ids", ["B", "S"], INT32), *[value(name, [1], INT32) for name in counts],
         value("length_penalty", [1]), value("repetition_penalty", [1]),
         value("attention_mask", ["B", "S"], INT32)], [value("sequences", None, INT32)])


def idle_search_feed(beam: int, max_length: int, source_length: int = 8) -> dict:
    one = lambda value, kind=np.int32: np.array([value], kind)  # noqa: E731
    return {"input_ids": np.full((1, source_length), 5, np.int32),
            "attention_mask": np.ones((1, source_length), np.int32),
            "max_length": one(max_length), "min_length": one(0), "num_beams": one(beam),
            "num_return_sequences": one(1), "length_penalty": one(1.0, np.float32),
            "repetition_penalty": one(1.0, np.float32)}


def operator_rows() -> list[dict]:
    """µs a step of the operator alone: (a 20-step search - a 4-step one) / 16."""
    short, long = 4, 20
    model = {"search": idle_search()}
    rows = []
    for beam in (1, 4):
        us = {}
        for threads in (1, 2):
            runs = {length: best_of(model, idle_search_feed(beam, length), 100,
                                    threads=threads)["search"] for length in (short, long)}
            us[f"{threads}t"] = round((runs[long] - runs[short]) / (long - short), 1)
        rows.append({"table": "operator", "beam": beam, "batch": 1, "us_per_step": us})
    return rows


TABLES = {"static": static_rows, "nbits": nbits_rows, "logp": logp_rows, "threads": threads_rows,
          "operator": operator_rows}


@app.command()
def main(json_out: Path = typer.Option(None, "--json", help="Also write the rows here."),
         table: str = typer.Option("", help=f"Only this table: {', '.join(TABLES)}.")) -> None:
    """Print one line per shape: microseconds per call of each variant."""
    import onnxruntime as ort

    rows = []
    for name in common.chosen(table, TABLES, "--table", "table") or TABLES:
        for row in TABLES[name]():
            rows.append(row)
            print(json.dumps(row), flush=True)
    if json_out:
        common.write_json(json_out, common.record(cpu="cpu", flags=True,
                                                  onnxruntime=ort.__version__, rows=rows),
                          indent=1)


if __name__ == "__main__":
    common.run_cli(app)
