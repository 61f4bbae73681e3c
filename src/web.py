"""`python -m src.web build` and `python -m src.web serve`: the model as a static web page.

    python -m src.web build --out site/            # model.int8.onnx, its tokenizers, the page
    python -m src.web build --out site/ --fp32     # model.onnx instead
    python -m src.web serve --dir site/            # http://127.0.0.1:8000/
"""

from __future__ import annotations

from pathlib import Path

import typer

from src.core.cli import run_cli
from src.core.paths import MODELS
from src.webpage import site_server, site_writer

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)


@app.command()
def build(
    out: Path = typer.Option(Path("site"), help="Directory to write the site to (replaced "
                             "if it holds a site this command wrote)."),
    model: Path = typer.Option(None, help="Model file (default: models/model.int8.onnx, or "
                               "models/model.onnx with --fp32)."),
    fp32: bool = typer.Option(False, "--fp32", help="Ship model.onnx (float32, ~3x the "
                              "bytes of int8) instead of model.int8.onnx."),
    tokenizer: Path = typer.Option(None, help="Tokenizer dir (default: tokenizer/ beside "
                                   "the model)."),
) -> None:
    """Write a static site that translates in the browser with no server: the page, its
    script, the model file, the tokenizers, and ONNX Runtime Web's and SentencePiece's files
    from the npm packages pinned in web/package-lock.json (installed with `npm ci` when
    missing). Any static file server can host it; `serve` adds the headers for threads."""
    if model is None:
        model = MODELS / ("model.onnx" if fp32 else "model.int8.onnx")
    elif fp32:
        raise typer.BadParameter("give --model or --fp32, not both")
    built = site_writer.build(model, tokenizer, out)
    total = sum(size for size, _ in built.files.values())
    packed = sum(zipped for _, zipped in built.files.values())
    for rel, (size, zipped) in built.files.items():
        print(f"  {rel:<36} {size / 1e6:8.2f} MB  {zipped / 1e6:8.2f} MB gzipped")
    print(f"web: wrote {built.out}/ ({len(built.files)} files, {total / 1e6:.1f} MB, "
          f"{packed / 1e6:.1f} MB gzipped); `python -m src.web serve --dir {built.out}` "
          "serves it")


@app.command()
def serve(
    directory: Path = typer.Option(Path("site"), "--dir", help="The built site."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every "
                             "interface)."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port (0: any free one)."),
) -> None:
    """Serve a built site with the cross-origin isolation headers that let ONNX Runtime Web
    use threads (any static server works, on one thread without them). Ctrl-C stops."""
    httpd = site_server.make_server(directory, host, port)
    bound_host, bound_port = httpd.server_address[:2]
    print(f"web: serving {directory}/ at http://{bound_host}:{bound_port}/ (Ctrl-C stops)",
          flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()


if __name__ == "__main__":
    run_cli(app)
