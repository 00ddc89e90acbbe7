"""Shared fixtures: seeds, a tiny float64 model config, and where the real corpora live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from txl import TransformerXLConfig

SHARED_DATA = Path(os.environ.get("TXL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def tiny_config() -> TransformerXLConfig:
    return TransformerXLConfig(vocab_size=37, n_layer=2, n_head=3, d_head=5, d_model=12, d_inner=20, mem_len=16)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data (or $TXL_SHARED_DATA); tests that need real text skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real corpora not found at {SHARED_DATA} (set TXL_SHARED_DATA to the shared/data folder)")
    return SHARED_DATA
