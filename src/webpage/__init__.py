"""The exported model as a static web page (`python -m src.web`): `site_writer` writes the site
(page, script, model file, tokenizers, ONNX Runtime Web's and SentencePiece's WebAssembly),
`site_server` serves it with the headers that let ONNX Runtime use threads. The page's sources
and their npm packages (pinned by web/package-lock.json) live in web/ at the repository root."""
