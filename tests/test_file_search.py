"""The exported files' searches against PyTorch and each other: the search Loop and the
BeamSearch operator, batches without the operator and one sentence with it alone, scores and
n-best lists, and the score switch."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_checks import forced_score, session
from toy_projects import MAX_POSITIONS

from src.core.special_ids import PAD
from src.data.batching import clip_source, pad
from src.graph import onnx_graph
from src.nmt import checkpoint
from src.nmt.search import beam_search, greedy_search, max_output_length
from src.runtime import batch_graph, contract, generation, operator_graph, placement, sessions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


# -- the float16 file for GPUs -----------------------------------------------------------------


# -- scores and n-best lists (issue 57) ----------------------------------------------------------
SCORE_TOLERANCE = {"fp32": 1e-4, "int8": 0.05}  # |ONNX - PyTorch| of a hypothesis's score


class FeedRecorder:
    """A session that records the score switch of every run."""

    def __init__(self, real, switches: list):
        self.real, self.switches = real, switches

    def get_inputs(self):
        return self.real.get_inputs()

    def run(self, names, feeds):
        switch = feeds.get(contract.SCORE_SWITCH)
        self.switches.append(None if switch is None else int(switch[0]))
        return self.real.run(names, feeds)


# -- the search Loop (src/graph/search_loop.py) --------------------------------------------------
def test_search_loop_decodes_as_the_beamsearch_operator_and_pytorch(project, tmp_path):
    """The Loop that drops finished sentences against ORT's own BeamSearch (the same subgraphs
    assembled with search="operator") and src.nmt.search: batches of mixed lengths, fp32 and
    int8, greedy with and without min_length forcing the length, beam 3."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    encoder, decoder = onnx_graph.export_subgraphs(model, 18)
    int8 = (onnx_graph.quantize_subgraph(encoder, tmp_path),
            onnx_graph.quantize_subgraph(decoder, tmp_path))
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])
    same_beam = total_beam = 0
    for name, pair in (("fp32", (encoder, decoder)), ("int8", int8)):
        sessions = {}
        for search in ("loop", "operator"):
            path = tmp_path / f"{name}_{search}.onnx"
            onnx.save(onnx_graph.assemble(*pair, {}, search=search), path)
            sessions[search] = session(path)
        for start in range(0, len(sources), 16):
            src = pad([clip_source(r, MAX_POSITIONS) for r in sources[start: start + 16]])
            max_len = max_output_length(src, 2.0, model)
            for beam, min_length in ((1, 0), (1, max_len + 1), (3, 0), (3, 4)):
                feeds = contract.search_feeds(src.numpy(), max_len, beam, 1.0)
                # + 1 above: the BOS start token counts (a new array: the feeds' own are shared)
                feeds["min_length"] = np.array([min_length], np.int32)
                loop, operator = (contract.parse_sequences(sessions[k].run(None, feeds)[0], 0)
                                  for k in ("loop", "operator"))
                if beam == 1:
                    assert loop == operator, (name, start, min_length)
                    assert min_length == 0 or {len(row) for row in loop} == {max_len}
                else:
                    same_beam += sum(a == b for a, b in zip(loop, operator))
                    total_beam += len(loop)
            if name == "fp32":
                assert contract.run_search(sessions["loop"], src.numpy(), max_len, 1, 1.0) \
                    == greedy_search(model, src, max_len)
                got = contract.run_search(sessions["loop"], src.numpy(), max_len, 3, 1.0)
                assert got == beam_search(model, src, 3, max_len), start
    assert same_beam >= 0.95 * total_beam


def test_the_search_loop_returns_pytorchs_n_best_lists(project):
    """A batch's n-best lists come from the Loop (files since `N_BEST_BATCHES`): each
    sentence's N best hypotheses and scores, best first, as src.nmt.search's beam search ranks
    every one it finished (or, at the length limit, its live beams), N = 1 included; short
    length limits make the live beams compete."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:32]
    loop = sessions.open_batch_session(project / "models/model.onnx", "cpu", 1)
    assert loop is not None
    compared = 0
    for start in range(0, len(sources), 16):
        src = pad([clip_source(r, MAX_POSITIONS) for r in sources[start: start + 16]])
        for max_len in (max_output_length(src, 2.0, model), 3):
            for n_best in (1, 2, 3):
                lists = contract.run_search_scored(loop, src.numpy(), max_len, 3, 1.0, 0,
                                                   n_best=n_best)
                expected = beam_search(model, src, 3, max_len, 1.0, n_best=n_best)
                for hyps, want in zip(lists, expected):
                    assert [h.ids for h in hyps] == [ids for ids, _ in want]
                    np.testing.assert_allclose([h.score for h in hyps],
                                               [score for _, score in want], rtol=1e-4)
                    compared += len(want)
    assert compared > 200


@pytest.mark.parametrize("beams, batch", [(3, 1), (3, 2), (1, 2)])  # operator, beam Loop, greedy
def test_every_search_refuses_more_hypotheses_than_beams(project, beams, batch):
    """A raw client asking for beams + 1 hypotheses gets an error from each search, where the
    Loops would pad the extra places (and greedy return one); up to the beam works."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(project / "models/model.onnx"),
                                   providers=["CPUExecutionProvider"])
    src = np.array([[40, 41, 42, 3]] * batch, np.int32)
    feeds = contract.search_feeds(src, 5, beams, 1.0, n_best=beams + 1)
    # the operator's own message, or the node that refuses it for the Loops
    refusal = "num_return_sequences" if batch == 1 else onnx_graph.RETURNS_CHECK
    with pytest.raises(Exception, match=refusal):
        session.run(["sequences"], feeds)
    feeds = contract.search_feeds(src, 5, beams, 1.0, n_best=beams)
    (sequences,) = session.run(["sequences"], feeds)
    assert sequences.shape[:2] == (batch, beams)


@pytest.mark.parametrize("beam", [1, 3])
def test_one_long_and_31_short_sentences_translate_as_one_by_one(project, beam):
    """A batch whose rows finish at very different steps: the rows that end early are dropped
    (greedy) or wait (beam), and no row's translation depends on the others."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])
    by_length = sorted(sources, key=len)
    batch = by_length[:31] + by_length[-1:]
    translator = generation.load_translator(project / "models/model.onnx", threads=1)
    together = translator.translate(batch, beam, batch_size=32)
    alone = [translator.translate([line], beam, batch_size=1)[0] for line in batch]
    assert together == alone
    assert len(set(together)) > 20  # real, different translations


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx", "model.text.onnx"])
def test_a_batch_is_searched_without_the_operator_and_translates_the_same(project, name,
                                                                        monkeypatch):
    """A batch goes to the file without its BeamSearch operator (src/runtime/batch_graph.py,
    which spares it the operator's dummy step), opened on the first batch, its n-best lists
    too; one sentence stays with the file's own session; every translation and score is the one the
    file's own session gives."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:40]
    path = project / "models" / name
    translator = generation.load_translator(path, threads=1)
    opened = []
    open_batch = translator.open_batch
    translator.open_batch = lambda: opened.append(open_batch()) or opened[-1]
    assert translator.session_for(1) is translator.session
    assert opened == []  # nothing opened before a batch comes
    batched = translator.translate_scored(sources, batch_size=7)
    (batch_session,) = opened  # once, for all six batches
    assert batch_session is not None and batch_session is not translator.session
    assert translator.session_for(7) is batch_session
    assert translator.session_for(1) is translator.session
    with monkeypatch.context() as patch:  # the file as written, not its operator alone
        patch.setattr(generation, "open_operator_session", lambda *_, **__: None)
        whole = generation.load_translator(path, threads=1)
    whole.open_batch = None  # every batch through the file as written
    assert whole.translate_scored(sources, batch_size=7) == batched
    assert whole.translate(sources, batch_size=7) == translator.translate(sources, batch_size=7)
    assert len({hyps[0].text for hyps in batched}) > 20  # real, different translations
    # a lone line takes a shorter way than a batch of one sentence: the same translations
    alone = [translator.translate([source])[0] for source in sources[:12]]
    assert alone == translator.translate(sources[:12], batch_size=1)
    assert translator.translate(["  "]) == [""] and translator.translate_scored([""]) == [()]
    assert [translator.translate_scored([source], n_best=2)[0] for source in sources[:12]] \
        == translator.translate_scored(sources[:12], batch_size=1, n_best=2)
    assert whole.translate_scored(sources, batch_size=7, n_best=2) \
        == translator.translate_scored(sources, batch_size=7, n_best=2)
    cut = onnx.load_from_string(batch_graph.without_operator(path.read_bytes()))
    ops = {n.op_type for n in cut.graph.node}
    assert "BeamSearch" not in ops and "Loop" in ops


def test_no_room_for_the_batch_search_is_a_warning_and_the_file_as_written(project, tmp_path,
                                                                          monkeypatch):
    """The file as written translates each batch as the searches cut from it do. (int8
    quantizes activations per batch, so a batch is compared with the same batch, never with
    its sentences one by one.)"""
    import contextlib

    lines = ["I have three cats.", "Where is the station?", "It is raining."]
    usual = generation.load_translator(project / "models/model.int8.onnx", threads=1)
    want = usual.translate(lines, batch_size=3), [usual.translate([ln])[0] for ln in lines]
    monkeypatch.setattr(sessions.tempfile, "TemporaryDirectory", lambda **_: (
        contextlib.nullcontext(str(tmp_path / "gone"))))  # writing there fails
    warnings: list[str] = []
    translator = generation.load_translator(project / "models/model.int8.onnx", threads=1,
                                            warn=warnings.append)
    together = translator.translate(lines, batch_size=3)
    assert translator.session_for(3) is translator.session
    assert warnings == ["one sentence goes through model.int8.onnx as written (no room for "
                        "its search alone: No such file or directory)",
                        "batches go through model.int8.onnx as written (no room for its batch "
                        "search: No such file or directory)"]
    assert (together, [translator.translate([line])[0] for line in lines]) == want


def test_requests_in_threads_open_the_batch_session_once(project):
    """The served model's requests come from a thread pool: the first batches, side by side,
    open one batch session between them."""
    from concurrent.futures import ThreadPoolExecutor

    translator = generation.load_translator(project / "models/model.int8.onnx", threads=1)
    opened = []
    open_batch = translator.open_batch

    def slow_open():
        time.sleep(0.2)  # every thread asks while the first is still opening
        opened.append(open_batch())
        return opened[-1]

    translator.open_batch = slow_open
    lines = ["I have three cats.", "Where is the station?", "It is raining."]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: translator.translate(lines, batch_size=3), range(4)))
    assert len(opened) == 1 and opened[0] is not None
    assert results == [results[0]] * 4


@pytest.mark.parametrize("name", ["model.onnx", "model.int8.onnx"])
def test_one_sentence_is_searched_by_the_operator_alone_and_translates_the_same(project, name):
    """One sentence and n-best lists go to the file as its BeamSearch operator alone, each
    subgraph holding its weights (src/runtime/operator_graph.py): every translation and score is
    the one the file's own session gives."""
    from datasets import load_from_disk

    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source"])[:12]
    path = project / "models" / name
    alone = onnx.load_from_string(operator_graph.operator_only(path.read_bytes()))
    assert [n.op_type for n in alone.graph.node] == ["Equal", "Not", "Cast", "BeamSearch"]
    subgraph_reads = [{i for n in a.g.node for i in n.input}
                      for a in alone.graph.node[-1].attribute
                      if a.type == onnx.AttributeProto.GRAPH]
    outer = {t.name for t in alone.graph.initializer} - {"pad_id"}
    assert outer and all(outer <= reads for reads in subgraph_reads)  # only the tied weights
    translator = generation.load_translator(path, threads=1)
    ops = {op for _, op in placement.assignments(translator.session)}
    assert "BeamSearch" in ops and "Loop" not in ops  # the operator alone, not the file
    file_metadata = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert translator.meta == file_metadata  # read from the session, as from the file
    whole = generation.Translator(sessions.open_session(path, "cpu", 1),
                                  translator.meta, translator.source, translator.target)
    for beam in (1, 3):
        for n_best in (1, 2) if beam > 1 else (1,):
            got = translator.translate_scored(sources, beam, batch_size=1, n_best=n_best)
            assert got == whole.translate_scored(sources, beam, batch_size=1, n_best=n_best)
    assert len({hyps[0].text for hyps in got}) > 8  # real, different translations


def test_a_text_twin_keeps_its_own_session(project):
    """The text twin's search sits between its tokenizer nodes: it is not cut."""
    path = project / "models/model.text.onnx"
    assert operator_graph.operator_only(path.read_bytes()) is None
    assert sessions.open_operator_session(path, "cpu", 1) is None


def test_an_operator_only_file_searches_batches_with_its_own_session(project, tmp_path):
    """A file whose batches are the operator's (no Loop beside it, as before the Loops):
    nothing to cut; nor in the fp16 file, whose Loops search every batch (no operator)."""
    model, _ = checkpoint.load_model(project / "models/model.pt")
    operator_only = tmp_path / "operator_only.onnx"
    onnx.save(onnx_graph.assemble(*onnx_graph.export_subgraphs(model, 18), {},
                                  search="operator"), operator_only)
    for path in (operator_only, project / "models/model.fp16.onnx"):
        assert batch_graph.without_operator(path.read_bytes()) is None
        assert operator_graph.operator_only(path.read_bytes()) is None
    assert sessions.open_batch_session(operator_only, "cpu", 1) is None


def test_scores_are_pytorchs_for_greedy_and_beam_in_every_search(project):
    """Each file's score of every hypothesis it returns is the score PyTorch gives that
    hypothesis (`forced_score`): one sentence (ONNX Runtime's BeamSearch operator) and batches
    (the Loops), greedy and beam 3, fp32 and int8 (the int8 weights move scores a little), at
    the split's output limit and at 4 tokens, where most hypotheses are cut.

    Whether the file's search finds PyTorch's hypotheses is not asserted, not even fp32's: a
    near tie within float32 rounding, which kernels summing in another order may flip, sends a
    search another way on some CPU, and no bound holds for where it then goes."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])
    worst = {}
    for name in ("fp32", "int8"):
        sess = session(project / ("models/model.onnx" if name == "fp32"
                                  else "models/model.int8.onnx"))
        for size in (1, 16):
            for start in range(0, 8 if size == 1 else len(sources), size):
                rows = [clip_source(r, MAX_POSITIONS) for r in sources[start: start + size]]
                src = pad(rows)
                for max_len in (max_output_length(src, 2.0, model), 4):
                    for beam in (1, 3):
                        got = contract.run_search_scored(sess, src.numpy(), max_len, beam, 1.0,
                                                         PAD)
                        for row, (hyp,) in zip(rows, got):
                            off = abs(hyp.score - forced_score(model, row, hyp.ids, max_len, 1.0))
                            worst[name] = max(worst.get(name, 0.0), off)
                        if name == "int8":
                            continue
                        # forced_score is PyTorch's search score, cut hypotheses included
                        want = beam_search(model, src, beam, max_len, 1.0, with_scores=True)
                        for row, (ids, score) in zip(rows, want):
                            assert forced_score(model, row, ids, max_len, 1.0) == \
                                pytest.approx(score, abs=1e-5), (row, ids, max_len)
    assert worst["fp32"] <= SCORE_TOLERANCE["fp32"], worst
    assert worst["int8"] <= SCORE_TOLERANCE["int8"], worst


def test_a_batch_asked_for_no_scores_skips_them_and_decodes_the_same(project):
    """Greedy search of a batch with the score switch off returns the same sequences and
    scores of 0 (its LogSoftmax runs on no rows); left out, the switch is on."""
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:16]
    src = pad([clip_source(r, MAX_POSITIONS) for r in sources])
    feeds = contract.search_feeds(src.numpy(), max_output_length(src, 2.0, model), 1, 1.0)
    for name in ("model.onnx", "model.int8.onnx"):
        sess = session(project / "models" / name)
        default = sess.run(None, feeds)
        on = sess.run(None, {**feeds, contract.SCORE_SWITCH: np.array([1], np.int32)})
        off = sess.run(None, {**feeds, contract.SCORE_SWITCH: np.array([0], np.int32)})
        assert np.array_equal(default[0], off[0]) and np.array_equal(default[0], on[0])
        assert np.array_equal(default[1], on[1]) and (on[1] != 0).all()
        assert (off[1] == 0).all(), name


@pytest.mark.parametrize("name", ["model.onnx", "model.text.onnx"])
def test_translating_without_scores_turns_the_switch_off(project, name):
    translator = generation.load_translator(project / "models" / name, threads=1)
    switches: list = []  # a batch of two and one of one: each session records
    translator.session = FeedRecorder(translator.session, switches)
    open_batch = translator.open_batch
    translator.open_batch = lambda: FeedRecorder(open_batch(), switches)
    lines = ["I have three cats.", "Where is the station?", "It is raining."]
    plain = translator.translate(lines, batch_size=2)
    assert switches == [0, 0]
    scored = translator.translate_scored(lines, batch_size=2)
    assert switches == [0, 0, 1, 1]
    assert [s[0].text for s in scored] == plain


def test_an_n_best_list_is_distinct_and_ordered_best_first(project):
    from datasets import load_from_disk

    model, _ = checkpoint.load_model(project / "models/model.pt")
    sources = list(load_from_disk(str(project / "data/tokenized"))["test"]["source_ids"])[:16]
    sess = session(project / "models/model.onnx")
    src = pad([clip_source(r, MAX_POSITIONS) for r in sources])
    max_len = max_output_length(src, 2.0, model)
    lists = contract.run_search_scored(sess, src.numpy(), max_len, 3, 1.0, 0, n_best=3)
    best = beam_search(model, src, 3, max_len, 1.0)
    assert {len(hyps) for hyps in lists} == {3}
    for hyps in lists:
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.ids) for h in hyps}) == 3
    assert sum(hyps[0].ids == ids for hyps, ids in zip(lists, best)) >= 0.9 * len(best)
