"""Dataset repos as the Hub lays them out, written straight into a Hugging Face cache folder, so
the download stage reads them with HF_HUB_OFFLINE=1 through `huggingface_hub` and `datasets`
exactly as it reads a fetched snapshot (only the network is left out).

A cache holds `datasets--<owner>--<name>/snapshots/<commit>/<files>` and `refs/<branch>` naming
the commit; each repo here is a README.md with `configs:` YAML plus parquet files, as
OPUS-100 (one config per pair, a `translation` column), WMT (pairs named target-first, no test
split) and FLORES+ (one config per language, joined on `id`) lay theirs out."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml


def parquet(columns: dict[str, list]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def readme(configs: dict[str, dict[str, str]]) -> bytes:
    """README.md whose `configs:` maps each config to {split: file pattern}."""
    meta = {"configs": [
        {"config_name": name, "data_files": [{"split": split, "path": pattern}
                                             for split, pattern in splits.items()]}
        for name, splits in configs.items()]}
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n# A test dataset\n".encode()


def put_repo(cache: Path, repo_id: str, files: dict[str, bytes], branch: str = "main") -> str:
    """Write the repo's files as one snapshot in `cache`; `branch` names it. Returns the commit."""
    digest = hashlib.sha1(repo_id.encode())
    for name in sorted(files):
        digest.update(name.encode() + files[name])
    commit = digest.hexdigest()
    folder = cache / f"datasets--{repo_id.replace('/', '--')}"
    for name, data in files.items():
        path = folder / "snapshots" / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / branch).write_text(commit)
    return commit


def opus_like(cache: Path, pairs: list[tuple[str, str]], test: list[tuple[str, str]] = (),
              repo_id: str = "test-org/opus-mini") -> str:
    """OPUS-100's layout: config `en-zh`, splits train/test, a `translation` dict column."""
    def rows(items):
        return parquet({"translation": [{"en": en, "zh": zh} for en, zh in items]})
    files = {"README.md": readme({"en-zh": {"train": "en-zh/train-*", "test": "en-zh/test-*"},
                                  "de-en": {"train": "de-en/train-*"}}),
             "en-zh/train-00000-of-00001.parquet": rows(pairs),
             "en-zh/test-00000-of-00001.parquet": rows(test or pairs[:2]),
             "de-en/train-00000-of-00001.parquet": parquet({"translation": [{"de": "x",
                                                                             "en": "y"}]})}
    return put_repo(cache, repo_id, files)


def wmt_like(cache: Path, pairs: list[tuple[str, str]], repo_id: str = "test-org/wmt-mini") -> str:
    """WMT's layout: the pair named target-first (`zh-en`), train and validation only."""
    rows = parquet({"translation": [{"zh": zh, "en": en} for en, zh in pairs]})
    files = {"README.md": readme({"zh-en": {"train": "zh-en/train-*",
                                            "validation": "zh-en/validation-*"}}),
             "zh-en/train-00000-of-00001.parquet": rows,
             "zh-en/validation-00000-of-00001.parquet": rows}
    return put_repo(cache, repo_id, files)


def flores_like(cache: Path, pairs: list[tuple[str, str]],
                repo_id: str = "test-org/flores-mini") -> str:
    """FLORES+'s layout: one config per language (`eng_Latn`, `cmn_Hans`), splits dev and
    devtest, rows joined on `id`, metadata columns beside the text (target rows reversed)."""
    def side(texts, lang):
        ids = list(range(len(texts)))
        return parquet({"id": ids, "iso_639_3": [lang] * len(texts), "text": texts,
                        "domain": ["wiki"] * len(texts)})
    english = side([en for en, _ in pairs], "eng")
    chinese = pa.table({"id": list(range(len(pairs)))[::-1], "iso_639_3": ["cmn"] * len(pairs),
                        "text": [zh for _, zh in pairs][::-1], "domain": ["wiki"] * len(pairs)})
    sink = io.BytesIO()
    pq.write_table(chinese, sink)
    files = {"README.md": readme({"eng_Latn": {"dev": "dev/eng_Latn.parquet",
                                               "devtest": "devtest/eng_Latn.parquet"},
                                  "cmn_Hans": {"dev": "dev/cmn_Hans.parquet",
                                               "devtest": "devtest/cmn_Hans.parquet"}}),
             "dev/eng_Latn.parquet": english, "devtest/eng_Latn.parquet": english,
             "dev/cmn_Hans.parquet": sink.getvalue(), "devtest/cmn_Hans.parquet": sink.getvalue()}
    return put_repo(cache, repo_id, files)


def offline_env(cache: Path) -> dict[str, str]:
    """The environment of a stage that must find everything in `cache`, never on the network."""
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": str(cache.parent / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}


def sacrebleu_set(folder: Path, name: str, langpair: str, pairs: list[tuple[str, str]]) -> None:
    """A sacreBLEU test set as sacreBLEU caches it once fetched ($SACREBLEU/<set>/<set>.<pair>.
    <field>, one file per field of a WMT set), so its API reads it without the network."""
    fields = {"src": [s for s, _ in pairs], "ref": [r for _, r in pairs],
              "docid": ["doc1"] * len(pairs), "genre": ["news"] * len(pairs),
              "origlang": [langpair.split("-")[0]] * len(pairs)}
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    for field, lines in fields.items():
        (out / f"{name}.{langpair}.{field}").write_text("\n".join(lines) + "\n",
                                                          encoding="utf-8")
