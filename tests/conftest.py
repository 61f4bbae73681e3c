"""Shared fixtures. Tracking is off for unit tests; the end-to-end test turns it on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(Path(__file__).parent))  # toy_corpus

os.environ.setdefault("NMT_TRACKING", "off")


@pytest.fixture
def toy_tsv(tmp_path: Path) -> Path:
    from toy_corpus import toy_tsv

    path = tmp_path / "toy.tsv"
    path.write_text(toy_tsv(), encoding="utf-8")
    return path
