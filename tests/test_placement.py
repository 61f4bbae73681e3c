"""Which provider runs which file (src/runtime/placement.py): the policy with the provider list
faked, the metadata read without onnx, and the node-placement report from ONNX Runtime's
record (real sessions of small hand-built graphs, fake ones for CUDA)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from src.core.errors import PipelineError
from src.runtime import placement, sessions
from src.runtime.placement import CPU, CUDA, FileKind

FP32, INT8, FP16 = FileKind("fp32", False), FileKind("int8", False), FileKind("fp16", False)
TEXT, INT8_TEXT = FileKind("fp32", True), FileKind("int8", True)


def small_model(path, metadata: dict[str, str], weight_elements: int = 50_000):
    """y = x + w, with a weight large enough that reading the file means skipping it."""
    weight = numpy_helper.from_array(np.arange(weight_elements, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [weight_elements])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [weight_elements])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    helper.set_model_props(model, metadata)
    onnx.save(model, path)
    return path


def test_metadata_is_read_as_onnx_reads_it(tmp_path):
    meta = {"format": "nmt-beamsearch-1", "weights": "int8", "target_lang": "zh",
            "note": "译文 " * 300,  # a value longer than one varint byte can say
            "empty": ""}
    path = small_model(tmp_path / "m.onnx", meta)
    expected = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert placement.read_metadata(path) == expected == meta


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto inside ModelProto field 14."""
    body = b"".join(b"%c" % (number << 3 | 2) + varint(len(text)) + text
                    for number, text in ((1, key.encode()), (2, value.encode())))
    return b"\x72" + varint(len(body)) + body  # field 14, wire type 2


def test_every_wire_type_is_walked(tmp_path):
    """Fields of each wire type (varint, 64-bit, 32-bit, length-delimited; varints of one,
    two and three bytes) before and between the metadata entries are skipped."""
    message = (b"\x08" + varint(300)  # field 1 varint, two bytes
               + b"\xa1\x01" + (7).to_bytes(8, "little")  # field 20, 64-bit
               + b"\xad\x01" + (9).to_bytes(4, "little")  # field 21, 32-bit
               + entry("a", "x" * 128)  # a length of 128: the varint 0x80 0x01
               + b"\x3a" + varint(20_000) + b"\0" * 20_000  # field 7 (the graph), 3-byte length
               + entry("b", "2")
               + b"\x72\x03\x12\x01v"  # an entry without a key field: the empty key
               + b"\x72\x03\x0a\x01k")  # one without a value field: the empty value
    assert list(placement.fields(message))[:3] == [(1, 0, 300), (20, 1, 7), (21, 5, 9)]
    path = tmp_path / "m.onnx"
    path.write_bytes(message)
    assert placement.read_metadata(path) == {"a": "x" * 128, "b": "2", "": "v", "k": ""}


@pytest.mark.parametrize("content, why", [
    (b"\x08", "truncated varint"),
    (b"\x08\x80", "truncated varint"),
    (b"\x0a\x05ab", "a field runs past the end"),
    (b"\x0b", "wire type 3"),
    (b"\x72\x02\x0a\x05", "a field runs past the end"),  # an entry cut inside the entry
    (b"", "cannot mmap an empty file"),
])
def test_a_file_that_is_not_onnx_is_one_line(tmp_path, content, why):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(PipelineError) as info:
        placement.read_metadata(path)
    assert str(info.value) == f"cannot read {path}: not an ONNX model ({why})"


def test_a_gpu_is_a_device_node_on_linux(tmp_path, monkeypatch):
    monkeypatch.setattr(placement.sys, "platform", "linux")
    (tmp_path / "nvidiactl").touch()  # the driver's control node alone is no GPU
    assert not placement.gpu_present(tmp_path)
    (tmp_path / "nvidia0").touch()
    assert placement.gpu_present(tmp_path)
    monkeypatch.setattr(placement.sys, "platform", "win32")
    assert placement.gpu_present(tmp_path / "none")  # elsewhere the session tells


def test_the_kind_comes_from_the_metadata():
    assert FileKind.of({"format": "nmt-beamsearch-1"}) == FP32
    assert FileKind.of({"format": "nmt-beamsearch-1", "weights": "int8"}) == INT8
    assert FileKind.of({"format": "nmt-text-1", "weights": "int8"}) == INT8_TEXT
    assert FileKind.of({"format": "nmt-beamsearch-1", "weights": "fp16"}) == FP16
    assert FileKind.of({}) == FP32


@pytest.fixture
def with_gpu(monkeypatch):
    monkeypatch.setattr(placement, "gpu_present", lambda: True)


ORT_GPU = [CUDA, CPU]


@pytest.mark.parametrize("choice, kind, expected", [
    ("auto", FP32, [CUDA, CPU]), ("auto", FP16, [CUDA, CPU]),
    ("auto", INT8, [CPU]), ("auto", TEXT, [CPU]), ("auto", INT8_TEXT, [CPU]),
    ("cuda", FP32, [CUDA, CPU]), ("cuda", INT8, [CUDA, CPU]), ("cuda", TEXT, [CUDA, CPU]),
    ("cuda", FP16, [CUDA, CPU]),
    ("cpu", FP32, [CPU]), ("cpu", INT8, [CPU]), ("cpu", TEXT, [CPU]),
])
def test_with_a_gpu_each_kind_of_file_gets_its_providers(with_gpu, choice, kind, expected):
    assert placement.providers_for(choice, kind, ORT_GPU) == expected


def test_with_a_gpu_fp16_on_the_cpu_is_refused(with_gpu):
    with pytest.raises(PipelineError, match=r"^model.fp16.onnx runs on CUDA only "
                                            r"\(--provider cpu; "):
        placement.providers_for("cpu", FP16, ORT_GPU)


@pytest.mark.parametrize("available, gpu, why", [
    ([CPU], True, "this onnxruntime has no CUDA provider"),
    ([CUDA, CPU], False, "no NVIDIA GPU found"),
])
def test_without_cuda_everything_but_fp16_runs_on_the_cpu(monkeypatch, available, gpu, why):
    monkeypatch.setattr(placement, "gpu_present", lambda: gpu)
    for kind in (FP32, INT8, TEXT, INT8_TEXT):
        assert placement.providers_for("auto", kind, available) == [CPU]
        with pytest.raises(PipelineError) as info:
            placement.providers_for("cuda", kind, available)
        assert str(info.value) == f"provider cuda is not available: {why} (use cpu)"
    with pytest.raises(PipelineError) as info:
        placement.providers_for("auto", FP16, available)
    assert str(info.value) == (f"model.fp16.onnx runs on CUDA only ({why}; on the CPU float16 "
                               f"is slower than float32): use model.onnx or model.int8.onnx "
                               f"there")


def test_an_unknown_provider_choice_is_refused():
    with pytest.raises(PipelineError, match="provider must be auto, cuda or cpu, not 'tpu'"):
        placement.providers_for("tpu", FP32, [CPU])


class FakeSession:
    """A session whose node assignments are given: {provider: [op types]}."""

    def __init__(self, nodes: dict[str, list[str]] | None, providers=(CUDA, CPU)):
        self.nodes, self.providers = nodes, list(providers)

    def get_providers(self):
        return self.providers

    def get_provider_graph_assignment_info(self):
        if self.nodes is None:
            raise AttributeError("onnxruntime < 1.24")
        return [SimpleNamespace(ep_name=ep, get_nodes=lambda ops=ops: [
            SimpleNamespace(op_type=op) for op in ops]) for ep, ops in self.nodes.items()]


def test_the_report_counts_nodes_per_provider_and_names_what_fell_back():
    session = FakeSession({CPU: ["Shape"] * 3 + ["Gather", "DynamicQuantizeLinear",
                                                 "DynamicQuantizeLinear", "Cast", "Squeeze"],
                           CUDA: ["MatMul"] * 100 + ["Add"] * 40})  # CPU first: CUDA leads
    assert placement.describe(session) == (
        "CUDAExecutionProvider 140 nodes, CPUExecutionProvider 8 nodes (Shape x3, "
        "DynamicQuantizeLinear x2, Squeeze, Gather and 1 more op types)")
    assert placement.describe(FakeSession({CPU: ["Add"]}, [CPU])) == "CPUExecutionProvider 1 node"
    four = FakeSession({CUDA: ["MatMul"], CPU: ["Shape", "Gather", "Cast", "Squeeze"]})
    assert placement.describe(four).endswith("(Squeeze, Shape, Gather, Cast)")  # no "0 more"
    assert placement.describe(FakeSession(None, [CPU])) == \
        "CPUExecutionProvider (node placement not reported by this onnxruntime)"


def test_a_file_forced_onto_cuda_warns_about_the_nodes_left_on_the_cpu():
    session = FakeSession({CUDA: ["MatMul"] * 30, CPU: ["MatMulInteger"] * 23
                           + ["DynamicQuantizeLinear"] * 16 + ["Shape"]})
    assert placement.fallback_warning(session, "model.int8.onnx") == (
        "model.int8.onnx on CUDA: 40 of 70 nodes run on the CPU (MatMulInteger x23, "
        "DynamicQuantizeLinear x16, Shape), with copies between the devices at each step")
    assert placement.fallback_warning(FakeSession({CUDA: ["MatMul"]}), "m.onnx") == ""
    assert placement.fallback_warning(FakeSession({CPU: ["MatMul"]}, [CPU]), "m.onnx") == ""


def test_a_real_session_reports_its_placement(tmp_path):
    session = sessions.open_session(small_model(tmp_path / "m.onnx", {"format": "x"}), "cpu", 1)
    assert placement.assignments(session) == Counter({(CPU, "Add"): 1})
    assert placement.describe(session) == "CPUExecutionProvider 1 node"


def test_an_fp16_file_is_refused_before_onnx_runtime_loads_it(tmp_path, monkeypatch):
    monkeypatch.setattr(placement, "gpu_present", lambda: False)
    path = small_model(tmp_path / "model.fp16.onnx", {"format": "nmt-beamsearch-1",
                                                      "weights": "fp16"})
    with pytest.raises(PipelineError, match="^model.fp16.onnx runs on CUDA only"):
        sessions.open_session(path, "auto", 1)


def test_cuda_libraries_are_loaded_before_a_session_that_asks_for_cuda(tmp_path, monkeypatch,
                                                                       capsys):
    """onnxruntime-gpu's CUDA provider finds pip-installed CUDA libraries only once they are
    loaded: `preload_dlls` runs once per process, and only where a session wants CUDA."""
    import onnxruntime as ort

    calls = []
    monkeypatch.setattr(ort, "preload_dlls", lambda: calls.append(1) or print("noise"),
                        raising=False)
    sessions.load_cuda_libraries.cache_clear()
    path = small_model(tmp_path / "m.onnx", {"format": "x"})
    sessions.open_session(path, "cpu", 1)
    assert calls == []
    # a GPU machine as `placement` sees it; this one has none, so ONNX Runtime falls back
    monkeypatch.setattr(placement, "providers_for", lambda *_: [CUDA, CPU])
    for _ in range(2):
        session = sessions.open_session(path, "auto", 1)
    assert calls == [1] and session.get_providers()[-1] == CPU
    assert "noise" not in capsys.readouterr().out  # the served model's stdout stays clean
    sessions.load_cuda_libraries.cache_clear()
