"""sacreBLEU's named test sets (wmt20, …) read through sacreBLEU's own API: fetched into its
cache ($SACREBLEU, by default ~/.sacrebleu) by the download stage and written into data/, so
evaluate never touches the network. The direction is the pipeline's `pair.*`; a set with
several references gives its first."""

from __future__ import annotations

import logging

from src.core.errors import PipelineError
from src.core.params import PairParams


def langpair(pair: PairParams) -> str:
    return f"{pair.source_lang}-{pair.target_lang}"


def sets_with(pair: str) -> list[str]:
    """sacreBLEU's test sets that have this language pair, newest names last."""
    from sacrebleu.dataset import DATASETS

    return sorted(name for name, dataset in DATASETS.items() if pair in dataset.langpairs)


def check_set(name: str, pair: PairParams) -> str:
    """The set's language pair, after checking sacreBLEU has the set in that direction (no
    network: sacreBLEU's own list), so a wrong name fails before any download."""
    from sacrebleu.dataset import DATASETS

    direction = langpair(pair)
    if name not in DATASETS or direction not in DATASETS[name].langpairs:
        what = f"no test set '{name}'" if name not in DATASETS else f"no {direction} in {name}"
        have = sets_with(direction)
        raise PipelineError(f"sacreBLEU has {what}; the sets with {direction}: "
                            f"{', '.join(have) if have else 'none'}")
    return direction


def sacrebleu_urls(name: str) -> list[str]:
    """Where sacreBLEU fetches the set from (its provenance, logged with the data)."""
    from sacrebleu.dataset import DATASETS

    return list(DATASETS[name].data or [])


def sacrebleu_rows(name: str, pair: PairParams) -> list[list[str]]:
    """[source, first reference] per segment of sacreBLEU's set `name` in the pair's direction."""
    from sacrebleu.dataset import DATASETS
    from sacrebleu.utils import SACREBLEU_DIR

    direction = check_set(name, pair)
    dataset = DATASETS[name]
    quiet = logging.getLogger("sacrebleu")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        sources = [line.rstrip("\n") for line in dataset.source(direction)]
        references = [refs[0].rstrip("\n") for refs in dataset.references(direction)]
    except (OSError, SystemExit) as exc:  # sacreBLEU exits on a bad checksum
        reason = f": {exc}" if isinstance(exc, OSError) else ""
        raise PipelineError(f"sacreBLEU could not fetch {name} ({direction}) into "
                            f"{SACREBLEU_DIR}{reason}") from None
    finally:
        quiet.level = level
    if len(sources) != len(references):
        raise PipelineError(f"sacreBLEU's {name} ({direction}) has {len(sources):,} sources but "
                            f"{len(references):,} references")
    return [[source, reference] for source, reference in zip(sources, references)]
