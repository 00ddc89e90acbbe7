"""The restricted unpickler, kept at its first address: it lives in :mod:`txl.interop.safe_pickle`."""

from .interop.safe_pickle import ALLOWED_GLOBALS, UnsafePickleError, safe_load_file, safe_loads

__all__ = ["UnsafePickleError", "ALLOWED_GLOBALS", "safe_loads", "safe_load_file"]
