"""parent: train.init_from -> models/parent/ (the model training starts from, and its tokenizer).

    python -m src.parent        # as `dvc repro` runs it, before tokenize

`train.init_from` is empty (random weights: models/parent/parent.json says so and nothing
else is written), a model.pt of ours with its tokenizer/ beside it, or a registered version
(`models:/nmt-en-zh@champion`, `models:/nmt-en-zh/3`), whose run holds the weights it was
exported from. DVC runs this stage when `train.init_from` (or this code) changes, like any
other: the file or alias is read then, and parent.json records what it resolved to (the
version, the sha256 of the weights), as download records a Hub branch's commit. An alias that
moves later is not seen until it is read again:

    dvc repro -f -s parent && dvc repro    # read train.init_from again; retrain if it moved

So the default pays nothing, and an alias the pipeline moves itself (export points
`candidate` at each new version) never feeds back into the next `dvc repro`. Refused in one
line, with nothing written: a file that is not a checkpoint of ours, a name, alias or version
the registry lacks, an unreachable tracking store, a model of another language pair.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import typer

from src.core import paths
from src.core.atomic import atomic_dir
from src.core.cli import run_cli
from src.core.errors import PipelineError
from src.core.params import PairParams, TrainParams, load_params
from src.data.subword import load_tokenizers, tokenizer_digest
from src.training.init_from import RECORD

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(1 << 20):  # pragma: no mutate (any read size: the same digest)
            digest.update(chunk)
    return digest.hexdigest()


def resolve(init_from: str, pair: PairParams, dest: Path) -> dict:
    """Fill `dest` (an empty folder) with the parent's model.pt and tokenizer/; returns the
    record. "" writes nothing and returns {"init_from": ""}."""
    if not init_from:
        return {"init_from": ""}
    record: dict = {"init_from": init_from}
    if init_from.startswith("models:/"):
        from src.core import registry

        ref = registry.parse_model_uri(init_from)
        client = registry.open_client()
        try:
            version = registry.find_version(client, ref)
        except PipelineError as exc:
            raise PipelineError(f"train.init_from {init_from}: {exc}") from None
        with tempfile.TemporaryDirectory(prefix=".parent-") as tmp:  # pragma: no mutate
            weights = registry.download_weights(client, ref, version, Path(tmp))
            copy_parent(weights / "model.pt", weights / "tokenizer", init_from, dest)
        record.update(name=ref.name, version=str(version.version), run_id=version.run_id)
    else:
        model_pt = Path(init_from)
        if not model_pt.is_file():
            raise PipelineError(f"train.init_from {init_from}: no such file")
        copy_parent(model_pt, model_pt.parent / "tokenizer", init_from, dest)
    # torch (seconds to import) only once a parent is found: neither the default stage, nor
    # tokenize (it reads records only), nor a name the registry or the disk lacks waits for it
    from src.nmt import checkpoint

    tok = load_tokenizers(dest / "tokenizer")
    if (tok.source_lang, tok.target_lang) != (pair.source_lang, pair.target_lang):
        raise PipelineError(
            f"train.init_from {init_from} translates {tok.source_lang}->{tok.target_lang}, "
            f"params.yaml's pair is {pair.source_lang}->{pair.target_lang}")
    config = checkpoint.load(dest / "model.pt")["config"]
    if (config.get("src_vocab"), config.get("tgt_vocab")) != (tok.source_vocab,
                                                              tok.target_vocab):
        raise PipelineError(f"train.init_from {init_from}: its model's vocabularies "
                            f"{config.get('src_vocab')}/{config.get('tgt_vocab')} are not its "
                            f"tokenizer's {tok.source_vocab}/{tok.target_vocab}")
    record.update(sha256=sha256_of(dest / "model.pt"),
                  tokenizer_sha256=tokenizer_digest(dest / "tokenizer"),
                  source_lang=tok.source_lang, target_lang=tok.target_lang, config=config)
    return record


def copy_parent(model_pt: Path, tokenizer: Path, init_from: str, dest: Path) -> None:
    """Only the weights and config of a checkpoint of ours (a training checkpoint's optimizer
    state does not come along), and the tokenizer beside it."""
    from src.nmt import checkpoint

    try:
        ckpt = checkpoint.load(model_pt)
    except PipelineError as exc:
        raise PipelineError(f"train.init_from {init_from} is not a checkpoint of ours "
                            f"({exc})") from None
    if not (tokenizer / "source.model").is_file():
        raise PipelineError(f"train.init_from {init_from}: no tokenizer/ beside it (a model.pt "
                            f"of ours lies beside the tokenizer/ folder it was trained with)")
    checkpoint.save({"model": ckpt["model"], "config": ckpt["config"]}, dest / "model.pt")
    shutil.copytree(tokenizer, dest / "tokenizer")


@app.command()
def main(out_dir: Path = typer.Option(paths.PARENT, help="Folder to write.")) -> None:
    """Resolve train.init_from to the weights and tokenizer training starts from."""
    cfg = load_params(TrainParams)
    pair = load_params(PairParams)
    with atomic_dir(out_dir) as tmp:
        record = resolve(cfg.init_from, pair, tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n",
                                  encoding="utf-8")
    if not record["init_from"]:
        print("parent: none (no train.init_from: training starts from random weights)")
        return
    version = f" = {record['name']} version {record['version']}" if "version" in record else ""
    print(f"parent: {record['init_from']}{version}, model.pt sha256 {record['sha256'][:12]}, "
          f"{record['source_lang']}->{record['target_lang']} (read now; a later change is "
          f"read by `dvc repro -f -s parent`)")


if __name__ == "__main__":
    run_cli(app)
