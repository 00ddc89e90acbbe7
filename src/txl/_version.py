"""The version of txl: the installed distribution's metadata, else (a source tree run without installing it)
the version that pyproject.toml beside ``src/`` declares."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

__all__ = ["DISTRIBUTION", "installed_version"]

DISTRIBUTION = "transformer-xl"
"""The name txl is published under on PyPI (``pip install transformer-xl``); the import name is ``txl``."""


def installed_version() -> str:
    """The version of the ``transformer-xl`` distribution that provides this package: its metadata when it is
    installed (a wheel, or ``pip install -e``), else the ``version`` line of the source tree's pyproject.toml,
    else ``0+unknown``."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        found = re.search(r'^version = "([^"]+)"$', pyproject.read_text(encoding="utf-8"), re.M)
    except OSError:
        found = None
    return found.group(1) if found else "0+unknown"
