"""A corpus from a dataset repo on the Hugging Face Hub, written as TSV lines (the download
stage's work for a `hub:` source).

`huggingface_hub` fetches a snapshot of the named revision into its cache (HF_HOME, HF_TOKEN,
HF_ENDPOINT and HF_HUB_OFFLINE work as everywhere else) and `datasets` reads it, streamed: a
corpus of millions of pairs never sits in a Python list. Only the files of the wanted config and
split are fetched (from the README's `configs:` metadata). The snapshot's folder name is the
commit the revision resolved to; that commit is what the stage records, so a branch is
read once and pinned, and offline a branch is looked up in the cache's refs, never replaced
by "the latest cached".

Each row becomes one TSV line with the source in `pair.source_column` and the target in
`pair.target_column`; with the `columns` layout the dataset's other text columns follow in
order (so a TSV corpus put on the Hub as a table comes back byte for byte).
"""

from __future__ import annotations

import difflib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import PipelineError
from src.core.params import HubSource, PairParams

HUB_PAGE = "https://huggingface.co/datasets/{}"
# config names users try that the Hub spells otherwise (FLORES+ names Mandarin by cmn)
ALIASES = {"zho_Hans": "cmn_Hans", "zho_Hant": "cmn_Hant"}
BATCH_ROWS = 10_000


@dataclass(frozen=True)
class Snapshot:
    folder: Path
    commit: str


def _download(hub: HubSource, revision: str, patterns: list[str] | None) -> Path:
    """snapshot_download of the dataset repo, its failures as one line each."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(hub.id, repo_type="dataset", revision=revision,
                                      allow_patterns=patterns))
    except GatedRepoError:
        raise PipelineError(
            f"{hub.id} is gated: accept its terms at {HUB_PAGE.format(hub.id)} while logged in, "
            "then set HF_TOKEN to an access token of that account") from None
    except RepositoryNotFoundError:
        raise PipelineError(f"no dataset {hub.id} on the Hub (a private one needs HF_TOKEN)"
                            ) from None
    except RevisionNotFoundError:
        raise PipelineError(f"dataset {hub.id} has no revision '{revision}' (a branch, tag or "
                            "commit)") from None
    except LocalEntryNotFoundError:
        offline = " (HF_HUB_OFFLINE is set)" if _offline() else ""
        raise PipelineError(
            f"the Hub cannot be reached{offline} and its cache holds no complete snapshot of "
            f"{hub.id} at revision '{revision}': run once with network access") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise PipelineError(f"the Hub answered HTTP {status} for {hub.id}: "
                            f"{str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise PipelineError(f"cannot write the Hub cache for {hub.id}: {exc}") from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def card_configs(folder: Path) -> dict[str, dict[str, list[str]]]:
    """`configs:` of the repo's README as {config: {split: [file patterns]}} ({} if none)."""
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    from huggingface_hub import metadata_load

    configs = (metadata_load(readme) or {}).get("configs") or []
    out: dict[str, dict[str, list[str]]] = {}
    for config in configs:
        files = config.get("data_files", [])
        by_split: dict[str, list[str]] = {}
        if isinstance(files, (str, list)) and not (files and isinstance(files, list)
                                                   and isinstance(files[0], dict)):
            by_split["train"] = [files] if isinstance(files, str) else list(files)
        else:
            entries = [{"split": k, "path": v} for k, v in files.items()] if isinstance(
                files, dict) else files
            for entry in entries:
                paths = entry["path"]
                by_split[entry["split"]] = [paths] if isinstance(paths, str) else list(paths)
        out[config.get("config_name", "default")] = by_split
    return out


def suggestion(wanted: str, available: list[str]) -> str:
    """A hint for a config that is not there: the pair the other way round (WMT's zh-en for
    en-zh), the Hub's spelling (cmn_Hans for zho_Hans), or a near name."""
    first, sep, second = wanted.partition("-")
    candidates = [f"{second}-{first}"] if sep else []
    candidates += [ALIASES[wanted]] if wanted in ALIASES else []
    candidates += difflib.get_close_matches(wanted, available, n=1)
    hit = next((c for c in candidates if c in available), None)
    return f"; did you mean '{hit}'?" if hit else ""


def _listed(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def fetch_snapshot(hub: HubSource) -> Snapshot:
    """The files of `hub`'s config(s) and split at its revision, and the commit it names.

    The README (and any loading script) comes first; the config and split are checked against
    it before any data file is fetched."""
    head = _download(hub, hub.revision, ["README.md", "*.py"])
    commit = head.name
    configs = card_configs(head)
    if not configs:
        if list(head.glob("*.py")):
            raise PipelineError(
                f"{hub.id} needs a loading script ({next(head.glob('*.py')).name}), which "
                "`datasets` no longer runs: use a revision with data files, e.g. "
                "refs/convert/parquet")
        return Snapshot(_download(hub, commit, None), commit)
    wanted = list(hub.configs) or [hub.config or next(iter(configs))]
    if not hub.config and not hub.configs and len(configs) > 1:
        raise PipelineError(f"{hub.id} has {len(configs)} configs; name one in hub.config: "
                            f"{_listed(sorted(configs))}")
    patterns = ["README.md"]
    for config in wanted:
        if config not in configs:
            raise PipelineError(
                f"{hub.id} has no config '{config}'{suggestion(config, sorted(configs))} "
                f"(it has: {_listed(sorted(configs))})")
        splits = configs[config]
        if hub.split not in splits:
            raise PipelineError(f"{hub.id} ({config}) has no split '{hub.split}' (it has: "
                                f"{', '.join(splits)})")
        patterns += splits[hub.split]
    return Snapshot(_download(hub, commit, patterns), commit)


def _open(snapshot: Snapshot, hub: HubSource, config: str | None):
    """The split as a streamed `datasets` IterableDataset, read from the local snapshot."""
    import datasets

    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(str(snapshot.folder), name=config or None,
                                     split=hub.split, streaming=True)
    except (ValueError, FileNotFoundError) as exc:
        raise PipelineError(f"{hub.id} ({config or 'default'}, {hub.split}) cannot be read: "
                            f"{str(exc).splitlines()[0]}") from None


def _columns(dataset, hub: HubSource, config: str | None) -> dict:
    features = dataset.features
    if features is None:  # a format whose columns are only known once read
        features = next(iter(dataset.take(1).iter(batch_size=1)), {})
    return dict(features)


def _missing(hub: HubSource, what: str, found: list[str], config: str | None = None) -> None:
    where = f"{hub.id} ({config or hub.config or 'default'}, {hub.split})"
    raise PipelineError(f"{where} has no {what} (it has: {', '.join(found) or 'nothing'})")


def clean_field(text) -> str | None:
    """A field on one TSV line (tabs and line breaks become spaces); null stays None."""
    return None if text is None else " ".join(str(text).replace("\t", " ").splitlines())


def hub_rows(snapshot: Snapshot, hub: HubSource, pair: PairParams
             ) -> Iterator[list[str | None]]:
    """Each row as [source, target, *other text columns], streamed in the split's order."""
    if hub.configs:
        yield from _joined_rows(snapshot, hub)
        return
    dataset = _open(snapshot, hub, hub.config)
    features = _columns(dataset, hub, hub.config)
    if hub.translation:
        if hub.translation not in features:
            _missing(hub, f"column '{hub.translation}'", list(features))
        keys = list(hub.keys) or [pair.source_lang, pair.target_lang]
        inner = features[hub.translation]
        found = list(getattr(inner, "languages", None) or (inner if isinstance(inner, dict)
                                                            else []))
        absent = [k for k in keys if found and k not in found]
        if absent:
            _missing(hub, f"'{absent[0]}' key in its '{hub.translation}' dicts", found)
        for batch in dataset.iter(batch_size=BATCH_ROWS):
            for entry in batch[hub.translation]:
                yield [clean_field(entry.get(keys[0])), clean_field(entry.get(keys[1]))]
        return
    absent = [c for c in hub.columns if c not in features]
    if absent:
        _missing(hub, f"column '{absent[0]}'", list(features))
    extras = [name for name, kind in features.items() if name not in hub.columns
              and getattr(kind, "dtype", "") in {"string", "large_string"}]
    for batch in dataset.iter(batch_size=BATCH_ROWS):
        for i in range(len(batch[hub.columns[0]])):
            yield [clean_field(batch[name][i]) for name in (*hub.columns, *extras)]


def _joined_rows(snapshot: Snapshot, hub: HubSource) -> Iterator[list[str | None]]:
    """FLORES+-style: one config per language, rows joined on `join_on` (the target side is
    held in memory: these are evaluation-sized sets)."""
    sides = []
    for config in hub.configs:
        dataset = _open(snapshot, hub, config)
        features = _columns(dataset, hub, config)
        for column in (hub.join_on, hub.text):
            if column not in features:
                _missing(hub, f"column '{column}'", list(features), config)
        sides.append(dataset)
    targets = {row[hub.join_on]: row[hub.text] for row in sides[1]}
    for row in sides[0]:
        if row[hub.join_on] in targets:
            yield [clean_field(row[hub.text]), clean_field(targets[row[hub.join_on]])]


def tsv_line(row: list[str | None], pair: PairParams) -> str:
    """[source, target, *extras] -> a TSV line with each side in its `pair.*_column` and the
    extras filling the other columns in order; a null field is empty, and a row of nulls only
    is an empty line (what a blank line of a TSV becomes in a table)."""
    if all(value is None for value in row):
        return "\n"
    row = ["" if value is None else value for value in row]
    width = max(pair.source_column, pair.target_column) + 1
    cols: list[str | None] = [None] * width
    cols[pair.source_column], cols[pair.target_column] = row[0], row[1]
    extras = iter(row[2:])
    cols = [c if c is not None else next(extras, "") for c in cols]
    return "\t".join([*cols, *extras]) + "\n"


def sample_lines(lines: Iterator[str], size: int, seed: int) -> list[str]:
    """A seeded uniform sample of `size` lines (reservoir: memory holds only the sample),
    returned in corpus order."""
    rng = random.Random(seed)
    kept: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        if i < size:
            kept.append((i, line))
        else:
            j = rng.randrange(i + 1)
            if j < size:
                kept[j] = (i, line)
    return [line for _, line in sorted(kept)]
