"""Which torch device a setting names: ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda``,
``cuda:N``; a device that does not exist here is a ConfigError naming the setting."""

from __future__ import annotations

import torch

from .config import ConfigError

__all__ = ["resolve_device"]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; refuses (``train.device: ...``) a device missing here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"train.device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: CUDA is not available on this machine")
    return device
