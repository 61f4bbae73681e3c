"""The page of `python -m src.web build` measured: its weight, a cold load, sentences/s in
headless Chromium beside native ONNX Runtime, and agreement with Python: docs/web.md.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import typer

from bench import common
from bench.common import REPO, ints, markdown_table, test_split, write_json
from src.core.paths import TOKENIZER
from src.webpage import site_server, site_writer

MARKER = "<!-- web table -->"
COLD_SENTENCE = "How are you?"


@contextmanager
def chromium():
    """A fresh headless Chromium (its own empty profile, so an empty cache), quit after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="nmt-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        driver.set_script_timeout(3600)
        try:
            yield driver
        finally:
            driver.quit()


def page_call(driver, script: str, *args):
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        f"(async () => {{ {script} }})().then(done, (e) => done({{error: String(e)}}));", *args)
    if isinstance(result, dict) and "error" in result:
        raise RuntimeError(result["error"])
    return result


def page_row(url: str, lines: list[str], threads: int, beam: int) -> dict:
    """A fresh browser (empty cache): seconds from navigation to the model loaded and to the
    first translation, then sentences/s over `lines` (after that first, warm-up sentence)."""
    with chromium() as driver:
        driver.get(f"{url}?threads={threads}")
        cold = page_call(driver, """
            await window.nmt.ready; const ready = performance.now();
            await window.nmt.translate([arguments[0]], {beam: arguments[1]});
            return {ready, first: performance.now(), isolated: self.crossOriginIsolated};
        """, COLD_SENTENCE, beam)
        timed = page_call(driver, """
            const start = performance.now();
            const out = await window.nmt.translate(arguments[0], {beam: arguments[1]});
            return {ms: performance.now() - start, threads: out.threads,
                    texts: out.results.map((r) => r && r.hypotheses[0].text)};
        """, lines, beam)
        version = driver.capabilities.get("browserVersion", "?")
    return {"engine": f"Chromium {version}, onnxruntime-web", "threads": timed["threads"],
            "cross_origin_isolated": cold["isolated"],
            "ready_s": round(cold["ready"] / 1000, 2),
            "first_translation_s": round(cold["first"] / 1000, 2),
            "sentences_per_s": round(len(lines) / (timed["ms"] / 1000), 1),
            "texts": timed["texts"]}


def native(spec: dict) -> dict:
    """src.infer's translator on the same lines, in a worker process of its own."""
    import onnxruntime

    from src.runtime.generation import load_translator

    t = load_translator(spec["model"], TOKENIZER, provider="cpu", threads=spec["threads"])
    t.translate([COLD_SENTENCE], spec["beam"])
    texts, seconds = common.timed(t.translate, spec["lines"], spec["beam"], batch_size=32)
    return {"engine": f"native ONNX Runtime {onnxruntime.__version__} (src.infer)",
            "threads": spec["threads"], "sentences_per_s": round(len(texts) / seconds, 1),
            "texts": texts}


def screenshot(url: str, lines: list[str], path: Path) -> None:
    """The page after translating `lines` with 2-best lists, as a user sees it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.set_window_size(1000, 1400)
        driver.get(url)
        wait = WebDriverWait(driver, 300)
        wait.until(lambda d: d.find_element(By.ID, "translate").is_enabled())
        for field, text in (("source", "\n".join(lines)), ("nbest", "2")):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(text)
        driver.find_element(By.ID, "translate").click()
        wait.until(lambda d: "per sentence" in d.find_element(By.ID, "status").text)
        driver.save_screenshot(str(path))


def weight(site: Path) -> dict:
    """MB and gzipped MB of ONNX Runtime Web, the model and the rest: the build's file sizes."""
    parts = {"onnxruntime-web": [0, 0], "model": [0, 0], "page, script, tokenizers": [0, 0]}
    model = json.loads((site / "config.json").read_text())["model"]
    for rel, (size, zipped) in site_writer.sizes(site).items():
        part = ("onnxruntime-web" if Path(rel).parts[0] == "ort" else
                "model" if rel == model else "page, script, tokenizers")
        parts[part][0] += size
        parts[part][1] += zipped
    return {k: {"mb": round(v[0] / 1e6, 2), "gzip_mb": round(v[1] / 1e6, 2)}
            for k, v in parts.items()}


def table(result: dict) -> str:
    """The Markdown tables of docs/web.md, from a JSON sitting."""
    w = result["weight"]
    lines = [f"Sitting of {result['date']}: {result['cpu']}; `{result['model']}`, "
             f"{result['sentences']:,} test sentences at beam {result['beam']}, batches of 32 "
             f"(`{result['file']}`).", ""]
    parts = [[part, f"{v['mb']:.2f}", f"{v['gzip_mb']:.2f}"] for part, v in w.items()]
    parts.append(["**total**", f"**{sum(v['mb'] for v in w.values()):.2f}**",
                  f"**{sum(v['gzip_mb'] for v in w.values()):.2f}**"])
    lines += markdown_table(["part of the page", "MB", "gzipped MB"], parts, ["---"] * 3)
    engines = [[row["engine"], row["threads"], f"{row['sentences_per_s']:.1f}",
                *((f"{row['ready_s']:.2f} s", f"{row['first_translation_s']:.2f} s")
                  if "ready_s" in row else ("", "")), row.get("same_text", "")]
               for row in result["rows"]]
    lines += ["", *markdown_table(["engine", "threads", "sentences/s", "model loaded (cold)",
                                   "first translation (cold)", "same text as src.infer"],
                                  engines, ["---"] * 6)]
    return "\n".join(lines)


app = common.cli_app()


@app.command(help=__doc__)
def main(
    site: Path = typer.Option(Path("site")),
    sentences: int = typer.Option(500),
    beam: int = typer.Option(4),
    threads: str = typer.Option("1,2", help="Thread counts, comma-separated."),
    json_out: Path = typer.Option(None, "--json", help="Write the sitting here."),
    doc: Path = typer.Option(None, help="Rewrite the table between the markers."),
    screenshot_out: Path = typer.Option(None, "--screenshot",
                                        help="Save a screenshot of the page here."),
    worker_spec: Path = typer.Option(None, "--worker", hidden=True),  # one native row
) -> None:
    if worker_spec:
        return common.serve_worker(worker_spec, native)
    config = json.loads((site / "config.json").read_text())
    lines = list(test_split()["source"][:sentences])
    httpd = site_server.make_server(site, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for count in ints(threads):
            spec = {"model": str((site / config["model"]).resolve()), "lines": lines,
                    "threads": count, "beam": beam}
            for row in (page_row(url, lines, count, beam),
                        common.run_worker("bench.web_page_speed", spec, Path(work))):
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "texts"}), flush=True)
    if screenshot_out:
        screenshot(url, (REPO / "docs/sample_sentences.en").read_text().splitlines()[:4],
                   screenshot_out)
    httpd.shutdown()
    reference = rows[1]["texts"]  # src.infer's, at the first thread count
    for row in rows:
        same = sum(a == b for a, b in zip(row.pop("texts"), reference))
        row["same_text"] = f"{same}/{len(reference)}"
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": common.cpu_description(flags=True),
              "model": config["model"], "sentences": len(lines), "beam": beam,
              "weight": weight(site), "rows": rows,
              "file": str(json_out) if json_out else "not saved"}
    print(table(result))
    if json_out:
        write_json(json_out, result, indent=1)
    if doc:
        common.replace_block(doc, MARKER, MARKER, table(result))


if __name__ == "__main__":
    common.run_cli(app)
