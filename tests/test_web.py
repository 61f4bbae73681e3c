"""The static site (`python -m src.web`): built from a tiny trained project, opened in headless
Chromium (Debian's `chromium` and `chromium-driver`), it translates exactly as `python -m
src.infer` does with the same file: texts, scores, token counts, confidence and the warnings of
lines cut to the model's limit, greedy and beam 4 in batches, n-best lists; and the page says
what went wrong instead of failing silently.

Without Chromium or npm the browser tests skip, unless NMT_REQUIRE_BROWSER=1 (CI sets it),
which makes a missing browser a failure."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.request
from pathlib import Path

import onnx
import pytest
from helpers import assert_one_line_error, run_stage
from onnx import TensorProto, helper
from toy_corpus import toy_pairs

from src.core.errors import PipelineError
from src.runtime.contract import GRAPH_FORMAT, TEXT_FORMAT
from src.webpage import site_server as server
from src.webpage import site_writer as site

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
BROWSER_MISSING = ("needs Debian's chromium and chromium-driver and npm" if not (
    CHROMIUM and DRIVER and shutil.which("npm")) else "")


def need_browser() -> None:
    if BROWSER_MISSING:
        if os.environ.get("NMT_REQUIRE_BROWSER") == "1":
            pytest.fail(BROWSER_MISSING)
        pytest.skip(BROWSER_MISSING)


def page_lines() -> list[str]:
    """≥ 50 sentences of several lengths (so batches differ in width and sentences end at
    different steps), a blank line, and lines the tokenizer meets rarely: unknown characters,
    Chinese in the source, extra spaces, one line past the model's 47-piece limit."""
    pairs = toy_pairs()
    lines = [en for en, _ in pairs[::19]]  # 57 of the 1,080, every person and verb
    lines[3:3] = ["", "I have 5 cats! 😺", "我 have two dogs.", "  She   likes   fish.  "]
    lines.append(" ".join(en for en, _ in pairs[:12]))  # ~100 pieces: cut to the limit
    return lines


# -- fast: what the build refuses, what the server sends -------------------------------------
def fake_model(path: Path, **metadata: str) -> Path:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    helper.set_model_props(model, metadata)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(("metadata", "fragment"), [
    ({"format": TEXT_FORMAT}, "is a text model"),
    ({"format": GRAPH_FORMAT, "weights": "fp16"}, "float16 weights for CUDA"),
    ({"format": "nmt-beamsearch-1"}, "written by an older version of the export"),
    ({"format": "something-else"}, "is not a translation model written by src.export"),
])
def test_build_refuses_files_the_browser_cannot_run(tmp_path, metadata, fragment):
    with pytest.raises(PipelineError, match=fragment):
        site.check_model(fake_model(tmp_path / "m.onnx", **metadata))


def test_build_refuses_a_missing_model_in_one_line(tmp_path):
    result = run_stage(tmp_path, "web", "build", "--out", str(tmp_path / "site"))
    assert_one_line_error(result, "model not found")


def test_build_never_replaces_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="not a site"):
        site.check_out(tmp_path)
    (tmp_path / "notes.txt").unlink()
    site.check_out(tmp_path)  # empty: fine
    (tmp_path / "config.json").write_text(json.dumps({"generator": site.GENERATOR}))
    site.check_out(tmp_path)  # ours: replaced


def test_npm_packages_skips_npm_when_installed_as_pinned(tmp_path, monkeypatch):
    lock = {"packages": {"": {"name": "x"}, "node_modules/a": {"version": "1.0.0"},
                         "node_modules/b-linux": {"version": "2.0.0", "optional": True},
                         "node_modules/b-darwin": {"version": "2.0.0", "optional": True}}}
    (tmp_path / "package-lock.json").write_text(json.dumps(lock))
    (tmp_path / "node_modules").mkdir()
    installed = {k: v for k, v in lock["packages"].items()
                 if k not in {"", "node_modules/b-darwin"}}
    hidden = tmp_path / "node_modules/.package-lock.json"
    hidden.write_text(json.dumps({"packages": installed}))
    calls = []
    monkeypatch.setattr(site.subprocess, "run", lambda *a, **k: calls.append(a) or
                        type("R", (), {"returncode": 0})())
    monkeypatch.setattr(site.shutil, "which", lambda name: "/usr/bin/npm")
    site.npm_packages(tmp_path)
    assert calls == []  # as pinned; another platform's optional build is not missing
    hidden.write_text(json.dumps({"packages": {**installed,
                                               "node_modules/a": {"version": "0.9.0"}}}))
    site.npm_packages(tmp_path)
    assert calls and calls[0][0][1:3] == ["ci", "--no-audit"]
    monkeypatch.setattr(site.shutil, "which", lambda name: None)
    with pytest.raises(PipelineError, match="npm not found"):
        site.npm_packages(tmp_path)


def test_server_sends_the_isolation_headers_and_wasm_type(tmp_path):
    (tmp_path / "index.html").write_text("<p>hi</p>")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "x.wasm").write_bytes(b"\0asm")
    httpd = server.make_server(tmp_path, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/"
        with urllib.request.urlopen(base) as page:
            assert page.headers["Cross-Origin-Opener-Policy"] == "same-origin"
            assert page.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        with urllib.request.urlopen(base + "x.wasm") as wasm:
            assert wasm.headers["Content-Type"] == "application/wasm"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_serve_refuses_a_directory_that_is_not_a_site(tmp_path):
    result = run_stage(tmp_path, "web", "serve", "--dir", str(tmp_path))
    assert_one_line_error(result, "is not a built site")


# -- slow: the page in Chromium against src.infer --------------------------------------------
@pytest.fixture(scope="module")
def project(exported_toy) -> Path:
    """The toy project exported once per run (tests/conftest.py): read, never changed."""
    return exported_toy


@pytest.fixture(scope="module")
def sites(project, tmp_path_factory) -> dict[str, Path]:
    """One site per model file: the default (int8) and --fp32."""
    need_browser()
    built = {}
    for name, extra in (("model.int8.onnx", []), ("model.onnx", ["--fp32"])):
        out = tmp_path_factory.mktemp("sites") / name
        result = run_stage(project, "web", "build", "--out", str(out), *extra)
        assert result.returncode == 0, result.stderr
        assert (out / name).is_file() and (out / "ort/ort-wasm-simd-threaded.wasm").is_file()
        built[name] = out
    return built


@pytest.fixture(scope="module")
def browser():
    need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_script_timeout(300)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(sites):
    """Each site served over HTTP (the page fetches its files), by name of its model."""
    servers = {name: server.make_server(path, "127.0.0.1", 0) for name, path in sites.items()}
    for httpd in servers.values():
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield {name: f"http://127.0.0.1:{httpd.server_address[1]}/"
           for name, httpd in servers.items()}
    for httpd in servers.values():
        httpd.shutdown()
        httpd.server_close()


def page_translate(browser, url: str, lines: list[str], beam: int, n_best: int = 1) -> dict:
    if browser.current_url != url:
        browser.get(url)
    result = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.nmt.translate(arguments[0], {beam: arguments[1], nBest: arguments[2]})"
        ".then(done, (e) => done({error: String(e)}));", lines, beam, n_best)
    assert "error" not in result, result
    return result


def python_translate(project: Path, model: Path, lines: list[str], beam: int, n_best: int = 1):
    source = project / "page_lines.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    result = run_stage(project, "infer", "--onnx", str(model), "--input", str(source),
                       "--beam", str(beam), "--n-best", str(n_best), "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    warnings = [line.removeprefix("warning: ") for line in result.stderr.splitlines()
                if line.startswith("warning: line")]
    return [json.loads(line) for line in result.stdout.splitlines()], warnings


# How close the page's scores come to Python's (src.infer rounds them to 6 decimals). float32:
# the same arithmetic, up to float rounding (the confidence curve's slope, ~27 on the fixture,
# scales a score's last digit). int8: WebAssembly's integer kernels are not x86's (measured on
# the fixture: up to 0.0075 apart, 2% of a score), and a near-tie may fall either way (below).
CLOSE = {"model.onnx": {"score": {"abs": 2e-6}, "confidence": {"abs": 2e-5}},
         "model.int8.onnx": {"score": {"rel": 0.05, "abs": 1e-3}, "confidence": {"abs": 0.05}}}


@pytest.mark.browser
@pytest.mark.parametrize("name", ["model.int8.onnx", "model.onnx"])
@pytest.mark.parametrize(("beam", "n_best"), [(1, 1), (4, 1), (4, 3)])
def test_page_translates_exactly_as_python(project, served, browser, name, beam, n_best):
    lines = page_lines()
    page = page_translate(browser, served[name], lines, beam, n_best)
    expected, warnings = python_translate(project, project / "models" / name, lines, beam,
                                          n_best)
    assert len([r for r in page["results"] if r]) >= 50
    assert page["warnings"] == warnings and len(warnings) == 1
    close, differ, best_differs = CLOSE[name], [], []
    for line_no, (got, want) in enumerate(zip(page["results"], expected, strict=True), 1):
        if not want["hypotheses"]:
            assert got is None, line_no
            continue
        pairs = [[(h["text"], h["tokens"]) for h in one["hypotheses"]] for one in (got, want)]
        if pairs[0] != pairs[1]:
            differ.append(line_no)
            if pairs[0][0] != pairs[1][0]:
                best_differs.append(line_no)
            continue
        for hyp, ref in zip(got["hypotheses"], want["hypotheses"]):
            assert hyp["score"] == pytest.approx(ref["score"], **close["score"]), line_no
        assert got["confidence"] == pytest.approx(want["confidence"], **close["confidence"])
    # float32 is the same arithmetic: every line the same. int8: each engine's integer kernels
    # round in their own way (x86 by its instruction set, WebAssembly its own), so where two
    # tokens lie closer than that rounding either engine may pick either. The toy model is
    # full of such near-ties, lower in an n-best list most of all (CI on an AMD EPYC Zen 5,
    # AVX-512 VNNI, 2026-12-02, of 62 lines: greedy 1 differed; beam 4 3-best 4 differed, in
    # a lower hypothesis, never the best; none on the Xeon or the AVX2 EPYCs). A broken
    # int8 path would change most best hypotheses, not a few.
    if name == "model.onnx":
        assert differ == []
    assert len(best_differs) <= len(expected) // 10, (best_differs, differ)


@pytest.mark.browser
def test_page_shows_translations_time_and_threads(served, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(served["model.int8.onnx"])
    wait = WebDriverWait(browser, 120)
    wait.until(lambda d: d.find_element(By.ID, "translate").is_enabled())
    box = browser.find_element(By.ID, "source")
    box.clear()
    box.send_keys("I have five cats.\n\nThey like two dogs.")
    nbest = browser.find_element(By.ID, "nbest")
    nbest.clear()
    nbest.send_keys("2")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: "per sentence" in d.find_element(By.ID, "status").text)
    items = browser.find_elements(By.CSS_SELECTOR, "#results > li")
    assert [i.get_attribute("value") for i in items] == ["1", "3"]  # the blank line skipped
    rows = items[0].find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 2 and rows[0].find_elements(By.TAG_NAME, "td")[2].text  # confidence
    expected = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.nmt.translate(['I have five cats.'], {beam: 3}).then(done);")
    assert rows[0].find_element(By.TAG_NAME, "td").text == \
        expected["results"][0]["hypotheses"][0]["text"]
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("2 sentences in ") and "1 thread" in status


@pytest.mark.browser
def test_page_says_what_is_wrong(served, browser, sites, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(served["model.int8.onnx"])
    wait = WebDriverWait(browser, 120)
    wait.until(lambda d: d.find_element(By.ID, "translate").is_enabled())

    def messages_after(text: str) -> str:
        box = browser.find_element(By.ID, "source")
        box.clear()
        if text:
            box.send_keys(text)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_element(By.ID, "messages").text)
        return browser.find_element(By.ID, "messages").text

    assert "Nothing to translate" in messages_after("")
    assert "truncated to the model's limit of 47" in messages_after(page_lines()[-1])

    broken = tmp_path / "broken"
    shutil.copytree(sites["model.int8.onnx"], broken)
    (broken / "model.int8.onnx").write_bytes(b"not an onnx file")
    httpd = server.make_server(broken, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{httpd.server_address[1]}/")
        wait.until(lambda d: d.find_element(By.ID, "messages").text)
        assert browser.find_element(By.ID, "messages").text.startswith(
            "The model failed to load: ")
        assert not browser.find_element(By.ID, "translate").is_enabled()
    finally:
        httpd.shutdown()
        httpd.server_close()
