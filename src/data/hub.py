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
order (so a TSV corpus put on the Hub as a table comes back byte for byte). What to fetch and
which columns to read is decided in src/data/hub_layout.py, from the repo's metadata alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import PipelineError
from src.core.params import HubSource, PairParams
from src.data.hub_layout import (
    card_configs,
    clean_field,
    data_patterns,
    joined_columns,
    text_columns,
    translation_keys,
)

HUB_PAGE = "https://huggingface.co/datasets/{}"
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


def read_card(folder: Path) -> dict[str, dict[str, list[str]]]:
    """`configs:` of the snapshot's README ({} without a README or metadata)."""
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    from huggingface_hub import metadata_load

    return card_configs(metadata_load(readme) or {})


def fetch_snapshot(hub: HubSource) -> Snapshot:
    """The files of `hub`'s config(s) and split at its revision, and the commit it names.

    The README (and any loading script) comes first; the config and split are checked against
    it before any data file is fetched."""
    head = _download(hub, hub.revision, ["README.md", "*.py"])
    commit = head.name
    configs = read_card(head)
    if not configs:
        if list(head.glob("*.py")):
            raise PipelineError(
                f"{hub.id} needs a loading script ({next(head.glob('*.py')).name}), which "
                "`datasets` no longer runs: use a revision with data files, e.g. "
                "refs/convert/parquet")
        return Snapshot(_download(hub, commit, None), commit)
    return Snapshot(_download(hub, commit, data_patterns(hub, configs)), commit)


def _open(snapshot: Snapshot, hub: HubSource, config: str | None):
    """The split as a streamed `datasets` IterableDataset, read from the local snapshot."""
    import datasets

    datasets.disable_progress_bars()
    # Where torch is installed, `datasets` imports it (~4 s, longer than reading a corpus of
    # thousands of pairs) to make a streamed split's state shareable with DataLoader workers;
    # the download stage reads the rows itself and never hands the split to torch.
    torch_available, datasets.config.TORCH_AVAILABLE = datasets.config.TORCH_AVAILABLE, False
    try:
        return datasets.load_dataset(str(snapshot.folder), name=config or None,
                                     split=hub.split, streaming=True)
    except (ValueError, FileNotFoundError) as exc:
        raise PipelineError(f"{hub.id} ({config or 'default'}, {hub.split}) cannot be read: "
                            f"{str(exc).splitlines()[0]}") from None
    finally:
        datasets.config.TORCH_AVAILABLE = torch_available


def _columns(dataset) -> dict:
    features = dataset.features
    if features is None:  # a format whose columns are only known once read
        features = next(iter(dataset.take(1).iter(batch_size=1)), {})
    return dict(features)


def hub_rows(snapshot: Snapshot, hub: HubSource, pair: PairParams
             ) -> Iterator[list[str | None]]:
    """Each row as [source, target, *other text columns], streamed in the split's order."""
    if hub.configs:
        yield from _joined_rows(snapshot, hub)
        return
    dataset = _open(snapshot, hub, hub.config)
    features = _columns(dataset)
    if hub.translation:
        source, target = translation_keys(hub, pair, features)
        for batch in dataset.iter(batch_size=BATCH_ROWS):
            for entry in batch[hub.translation]:
                yield [clean_field(entry.get(source)), clean_field(entry.get(target))]
        return
    columns = text_columns(hub, features)
    for batch in dataset.iter(batch_size=BATCH_ROWS):
        for i in range(len(batch[columns[0]])):
            yield [clean_field(batch[name][i]) for name in columns]


def _joined_rows(snapshot: Snapshot, hub: HubSource) -> Iterator[list[str | None]]:
    """FLORES+-style: one config per language, rows joined on `join_on` (the target side is
    held in memory: these are evaluation-sized sets)."""
    sides = []
    for config in hub.configs:
        dataset = _open(snapshot, hub, config)
        joined_columns(hub, _columns(dataset), config)
        sides.append(dataset)
    targets = {row[hub.join_on]: row[hub.text] for row in sides[1]}
    for row in sides[0]:
        if row[hub.join_on] in targets:
            yield [clean_field(row[hub.text]), clean_field(targets[row[hub.join_on]])]
