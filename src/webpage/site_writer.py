"""Writes the static site of one exported model (docs/web.md).

The page's script is bundled from web/page/ by esbuild with the SentencePiece library (its
WebAssembly inline); ONNX Runtime Web's module, its WebAssembly glue and binary are copied beside
it as they are (its threads load the glue by URL). `config.json` carries what the Python
translator reads from the file's metadata, which onnxruntime-web does not expose. The site is
written to a scratch directory beside `out` and moved into place when complete, so a failed
build never leaves half a site.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import PipelineError
from src.data.subword import CJK_RANGES
from src.runtime import confidence, placement
from src.runtime.contract import GRAPH_FORMAT, MAX_BEAM, check_format
from src.runtime.generation import load_tokenizers_for

WEB = Path(__file__).resolve().parents[2] / "web"  # the page's sources and npm packages
PAGE_FILES = ("index.html", "style.css")
ORT_DIST = Path("node_modules/onnxruntime-web/dist")
# The non-bundled ESM build: it loads the glue below by URL, which its worker threads need.
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
# ONNX Runtime Web's files carry their MIT notice in their first lines; the SentencePiece
# library's Apache-2.0 licence goes beside the bundle that holds it.
LICENSES = {"sentencepiece-js.LICENSE.txt": "node_modules/@sctg/sentencepiece-js/LICENSE"}
GENERATOR = "src.web build"  # config.json's `generator`: what marks a directory as our site
CONFIG_KEYS = ("pad_id", "bos_id", "eos_id", "max_source_tokens", "max_output_tokens",
               "beam_size")


@dataclass(frozen=True)
class Built:
    out: Path
    files: dict[str, tuple[int, int]]  # relative path -> (bytes, gzipped bytes)


def page_config(model: Path, meta: dict[str, str], tokenizers: dict[str, str]) -> dict:
    """config.json: the model file and tokenizers' names and what the page reads of the file's
    metadata (special ids, limits, the export's search defaults, the confidence curve)."""
    calibration = confidence.from_metadata(meta)
    return {
        "generator": GENERATOR,
        "model": model.name,
        "model_bytes": model.stat().st_size,
        "weights": meta.get("weights", "fp32"),
        **{key: int(meta[key]) for key in CONFIG_KEYS},
        "length_penalty": float(meta["length_penalty"]),
        "max_length_ratio": float(meta["max_length_ratio"]),
        "max_beam": MAX_BEAM,
        "calibration": None if calibration is None else {
            "slope": calibration.slope, "intercept": calibration.intercept},
        "cjk_ranges": [list(pair) for pair in CJK_RANGES],
        "source_tokenizer": tokenizers["source"],
        "target_tokenizer": tokenizers["target"],
    }


def check_model(model: Path) -> dict[str, str]:
    """The file's metadata, or a one-line refusal of what the browser cannot run."""
    if not model.is_file():
        raise PipelineError(f"model not found: {model} (run `dvc repro`, whose export stage "
                            "writes it, or pass --model)")
    meta = placement.read_metadata(model)
    kind = placement.FileKind.of(meta)
    if kind.text:
        raise PipelineError(f"{model.name} is a text model: its SentencePiece operators come "
                            "from onnxruntime-extensions, which no web build has; build from "
                            "model.int8.onnx or model.onnx")
    if kind.weights == "fp16":
        raise PipelineError(f"{model.name} holds float16 weights for CUDA; the browser's "
                            "WebAssembly runs model.int8.onnx or model.onnx")
    check_format(meta, model, (GRAPH_FORMAT,))
    return meta


def check_out(out: Path) -> None:
    """`out` may be absent, empty, or a site this command wrote: never a directory of other
    files, which replacing it would delete."""
    if not out.exists():
        return
    if not out.is_dir():
        raise PipelineError(f"--out {out} is a file, not a directory")
    if not any(out.iterdir()):
        return
    try:
        ours = json.loads((out / "config.json").read_text())["generator"] == GENERATOR
    except (OSError, ValueError, KeyError, TypeError):
        ours = False
    if not ours:
        raise PipelineError(f"--out {out} holds files that are not a site of `{GENERATOR}`: "
                            "choose another directory or empty it")


def npm_packages(web: Path = WEB) -> None:
    """web/node_modules as web/package-lock.json pins it (`npm ci`, install scripts off: none
    of the packages needs one), unless it already is: npm writes node_modules/.package-lock.json
    on every install, its entries those of the lockfile."""
    try:
        wanted = json.loads((web / "package-lock.json").read_text())["packages"]
        installed = json.loads((web / "node_modules/.package-lock.json").read_text())["packages"]
        # every installed package as pinned, and every pinned one there but other
        # platforms' optional builds (esbuild's binaries)
        if all(wanted.get(name) == spec for name, spec in installed.items()) and all(
                name in installed for name, spec in wanted.items()
                if name and not spec.get("optional")):
            return
    except (OSError, ValueError, KeyError):
        pass
    npm = shutil.which("npm")
    if npm is None:
        raise PipelineError("npm not found: the page's packages (ONNX Runtime Web, "
                            "SentencePiece, esbuild) install with npm; install Node.js 18 or "
                            "newer")
    print(f"web: installing the page's npm packages (npm ci in {web})", file=sys.stderr)
    result = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=web,
                            stdout=sys.stderr, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise PipelineError(f"npm ci failed in {web} (exit {result.returncode}; its output is "
                            "above)")


def bundle(web: Path, target: Path) -> None:
    """web/page/app.js and its imports (the tokenizer library) as one minified module; ONNX
    Runtime stays a separate file (./ort/), and the library's Node-only imports are stubbed."""
    esbuild = web / "node_modules/.bin/esbuild"
    result = subprocess.run(
        [str(esbuild), "page/app.js", "--bundle", "--format=esm", "--minify",
         "--platform=browser", "--external:./ort/*", "--external:module",
         "--alias:fs=./page/no-fs.js", "--log-level=warning", f"--outfile={target}"],
        cwd=web, capture_output=True, text=True)
    if result.returncode != 0:
        first = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[0]
        raise PipelineError(f"bundling the page script failed: {first}")


def build(model: Path, tokenizer_dir: Path | None, out: Path, web: Path = WEB) -> Built:
    meta = check_model(model)
    tokenizer_dir = Path(tokenizer_dir or model.parent / "tokenizer")
    load_tokenizers_for(model, tokenizer_dir, meta)  # present and the export's, or one line
    check_out(out)
    npm_packages(web)
    staging = out.parent / f".{out.name}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        bundle(web, staging / "app.js")
        for name in PAGE_FILES:
            shutil.copyfile(web / "page" / name, staging / name)
        (staging / "ort").mkdir()
        for name in ORT_FILES:
            shutil.copyfile(web / ORT_DIST / name, staging / "ort" / name)
        for name, rel in LICENSES.items():
            shutil.copyfile(web / rel, staging / name)
        tokenizers = write_tokenizers(tokenizer_dir, staging)
        shutil.copyfile(model, staging / model.name)
        config = page_config(model, meta, tokenizers)
        (staging / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Built(out, sizes(out))


def write_tokenizers(tokenizer_dir: Path, site: Path) -> dict[str, str]:
    """Each SentencePiece model as the base64 text the JS library loads; a shared vocabulary
    (the same file on both sides) is written once."""
    names: dict[str, str] = {}
    written: dict[bytes, str] = {}
    for side in ("source", "target"):
        data = (tokenizer_dir / f"{side}.model").read_bytes()
        if data not in written:
            written[data] = f"{side}.spm.b64"
            (site / written[data]).write_text(base64.b64encode(data).decode() + "\n")
        names[side] = written[data]
    return names


def sizes(site: Path) -> dict[str, tuple[int, int]]:
    """Each file's bytes and gzipped bytes (what a compressing server sends)."""
    return {str(path.relative_to(site)): (path.stat().st_size,
                                          len(gzip.compress(path.read_bytes(), 6)))
            for path in sorted(site.rglob("*")) if path.is_file()}
