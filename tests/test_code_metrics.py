"""tools/code_metrics.py: the settings family and the library's errors that name a flag, counted on a small tree
written here (what it should find is known from the text)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "code_metrics.py"


@pytest.fixture(scope="module")
def metrics():
    spec = importlib.util.spec_from_file_location("code_metrics", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


LIBRARY = """
from dataclasses import dataclass

@dataclass(frozen=True)
class Span:
    mem_len: int
    clamp_len: int | None = None

@dataclass(frozen=True)
class ReadSettings:
    mem_len: int = 0
    batch_size: int = 1
    span: Span | None = None

@dataclass(frozen=True)
class ModelConfig:
    mem_len: int = 0

@dataclass
class Loose:  # not frozen: not a settings value
    mem_len: int = 0

@dataclass(frozen=True)
class Result:  # frozen, but not named as settings are
    mem_len: int = 0

def check(n):
    if n > 3:
        raise ValueError(f"--mem-len {n} is too long")
    if n < 0:
        raise ValueError("mem_len: must be >= 0 (x--y names no flag)")
    message = "--batch-size"
    raise ValueError(message)  # the text is elsewhere: not counted
"""

CLI = """
def fail():
    raise ValueError("--mem-len must be positive")
"""


def test_settings_values_and_their_flat_fields_are_counted(tmp_path, metrics):
    src = tmp_path / "pkg"
    (src / "cli").mkdir(parents=True)
    (src / "lib.py").write_text(LIBRARY)
    (src / "cli" / "__init__.py").write_text(CLI)
    (src / "demo.py").write_text(CLI)
    family = metrics.settings(src)
    assert family["values"] == ["pkg/lib.py:Span", "pkg/lib.py:ReadSettings", "pkg/lib.py:ModelConfig"]
    fields = family["fields"]
    assert fields["mem_len"] == ["ModelConfig", "ReadSettings"]  # Span's own field is the unit, not a copy
    assert fields["batch_size"] == ["ReadSettings"] and fields["clamp_len"] == []
    assert "span" not in fields  # held by one value only, and not a tracked field
    line = LIBRARY.splitlines().index('        raise ValueError(f"--mem-len {n} is too long")') + 1
    assert metrics.flag_raises(src) == [f"pkg/lib.py:{line}"]  # not the cli/, not the demo, not x--y


def test_the_package_counts(metrics):
    """The figures of this package that the settings family is held to."""
    src = Path(__file__).resolve().parent.parent / "src" / "txl"
    fields = metrics.settings(src)["fields"]
    for name, most in [
        ("mem_len", 4),
        ("clamp_len", 4),
        ("same_length", 4),
        ("tgt_len", 6),
        ("batch_size", 6),
        ("checkpoint", 2),
        ("device", 2),
    ]:
        assert len(fields[name]) <= most, (name, fields[name])
    assert metrics.flag_raises(src) == []
