"""Where a Hub dataset's pairs are, worked out from what the repo declares: its configs and their
files per split (the README's `configs:` metadata), the columns of the chosen split, and the
pair's languages. Pure: src/data/hub.py fetches and streams, this decides what to fetch and
read, and refuses in one line (with a did-you-mean) what is not there.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterator, Mapping

from src.core.errors import PipelineError
from src.core.params import HubSource, PairParams

# config names users try that the Hub spells otherwise (FLORES+ names Mandarin by cmn)
ALIASES = {"zho_Hans": "cmn_Hans", "zho_Hant": "cmn_Hant"}
TEXT_DTYPES = {"string", "large_string"}


def card_configs(metadata: Mapping) -> dict[str, dict[str, list[str]]]:
    """The README metadata's `configs:` as {config: {split: [file patterns]}} ({} if none).
    `data_files` is a pattern or a list of them (all of it the train split), a {split:
    pattern(s)} mapping, or a list of {split, path} entries, as the Hub documents."""
    out: dict[str, dict[str, list[str]]] = {}
    for config in metadata.get("configs") or []:
        files = config.get("data_files", [])
        by_split: dict[str, list[str]] = {}
        if isinstance(files, str) or (isinstance(files, list)
                                      and not (files and isinstance(files[0], dict))):
            by_split["train"] = [files] if isinstance(files, str) else list(files)
        else:
            entries = ([{"split": k, "path": v} for k, v in files.items()]
                       if isinstance(files, dict) else files)
            for entry in entries:
                paths = entry["path"]
                by_split[entry["split"]] = [paths] if isinstance(paths, str) else list(paths)
        out[config.get("config_name", "default")] = by_split
    return out


def suggestion(wanted: str, available: list[str]) -> str:
    """A hint for a config that is not there: the pair the other way round (WMT's zh-en for
    en-zh), the Hub's spelling (cmn_Hans for zho_Hans), or a near name."""
    first, sep, second = wanted.partition("-")
    reversed_pair = f"{second}-{first}"
    # without a dash the "reversed pair" is "-name", whose nearest match is the same
    candidates = [reversed_pair] if sep else []  # pragma: no mutate
    candidates += [ALIASES[wanted]] if wanted in ALIASES else []
    # more matches change nothing: the first, the closest, is in `available`
    candidates += difflib.get_close_matches(wanted, available, n=1)  # pragma: no mutate
    hit = next((c for c in candidates if c in available), None)
    return f"; did you mean '{hit}'?" if hit else ""


def listed(names: list[str], limit: int = 20) -> str:
    """Names for an error line: the first `limit`, then how many more."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def data_patterns(hub: HubSource, configs: dict[str, dict[str, list[str]]]) -> list[str]:
    """The files to fetch for `hub`'s config(s) and split: the README and the split's data
    file patterns. Refused: no config named where the repo has several, an unknown config (with
    a did-you-mean) or split."""
    if not hub.config and not hub.configs and len(configs) > 1:
        raise PipelineError(f"{hub.id} has {len(configs)} configs; name one in hub.config: "
                            f"{listed(sorted(configs))}")
    wanted = list(hub.configs) or [hub.config or next(iter(configs))]
    patterns = ["README.md"]
    for config in wanted:
        if config not in configs:
            raise PipelineError(
                f"{hub.id} has no config '{config}'{suggestion(config, sorted(configs))} "
                f"(it has: {listed(sorted(configs))})")
        splits = configs[config]
        if hub.split not in splits:
            raise PipelineError(f"{hub.id} ({config}) has no split '{hub.split}' (it has: "
                                f"{', '.join(splits)})")
        patterns += splits[hub.split]
    return patterns


def missing(hub: HubSource, what: str, found: list[str], config: str | None = None
            ) -> PipelineError:
    """The one line for a column or key the split lacks, with what it has."""
    where = f"{hub.id} ({config or hub.config or 'default'}, {hub.split})"
    return PipelineError(f"{where} has no {what} (it has: {', '.join(found) or 'nothing'})")


def translation_keys(hub: HubSource, pair: PairParams, features: Mapping) -> list[str]:
    """The [source, target] keys of the `translation` column's dicts: `hub.keys`, else the
    pair's languages; refused when the column or a key is not there (a column whose keys are
    only known once read passes, and a row without a key gives an empty side)."""
    if hub.translation not in features:
        raise missing(hub, f"column '{hub.translation}'", list(features))
    keys = list(hub.keys) or [pair.source_lang, pair.target_lang]
    inner = features[hub.translation]
    found = list(getattr(inner, "languages", None)
                 or (inner if isinstance(inner, dict) else []))
    absent = [k for k in keys if found and k not in found]
    if absent:
        raise missing(hub, f"'{absent[0]}' key in its '{hub.translation}' dicts", found)
    return keys


def text_columns(hub: HubSource, features: Mapping) -> list[str]:
    """The columns a row's TSV line is made of: `hub.columns` (source, target), then the
    split's other text columns in order; refused when a named column is not there."""
    absent = [c for c in hub.columns if c not in features]
    if absent:
        raise missing(hub, f"column '{absent[0]}'", list(features))
    extras = [name for name, kind in features.items()
              if name not in hub.columns and is_text(kind)]
    return [*hub.columns, *extras]


def is_text(feature) -> bool:
    """A string column (a feature without a dtype, such as a list or a dict, is not)."""
    dtype = getattr(feature, "dtype", "")  # pragma: no mutate (None or "XXXX": not text either)
    return dtype in TEXT_DTYPES


def joined_columns(hub: HubSource, features: Mapping, config: str) -> None:
    """One config of a `configs` (FLORES+-style) source has its id and text columns."""
    for column in (hub.join_on, hub.text):
        if column not in features:
            raise missing(hub, f"column '{column}'", list(features), config)


def clean_field(text) -> str | None:
    """A field on one TSV line (tabs and line breaks become spaces); null stays None."""
    return None if text is None else " ".join(str(text).replace("\t", " ").splitlines())


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
