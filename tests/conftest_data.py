"""Helpers shared by the data tests: where the real corpora are, and skipping when they are absent.

Plain functions rather than fixtures, so test modules import them without shadowing fixture names.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data_candidates() -> list[Path]:
    """$TXL_DATA_DIR entries, $TXL_SHARED_DATA (as tests/conftest.py), then ../shared/data."""
    env = [Path(p) for p in os.environ.get("TXL_DATA_DIR", "").split(os.pathsep) if p]
    shared = [Path(os.environ["TXL_SHARED_DATA"])] if os.environ.get("TXL_SHARED_DATA") else []
    return [*env, *shared, REPO_SHARED_DATA]


def shared_corpus_dir(name: str) -> Path:
    """The data folder that holds corpus `name` (as `<dir>/<name>/`), or skip the test."""
    for d in shared_data_candidates():
        if (d / name).is_dir():
            return d
    looked = ", ".join(str(d / name) for d in shared_data_candidates())
    pytest.skip(f"real corpus '{name}' not available (looked in {looked}); set TXL_DATA_DIR to run this test")
