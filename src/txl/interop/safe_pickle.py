"""Reading pickled vocabularies without running pickle code: an unpickler that builds only plain containers,
strings and numbers and refuses every other global, for plain pickles and both ``torch.save`` layouts
without tensors.
"""

from __future__ import annotations

import codecs
import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from ..errors import TxlError

__all__ = ["UnsafePickleError", "ALLOWED_GLOBALS", "safe_loads", "safe_load_file"]


class UnsafePickleError(TxlError):
    """A pickle that refers to anything besides plain containers, strings and numbers, or is unreadable."""


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it to carry bytes; only a Latin-1 text codec is accepted."""
    if not isinstance(text, str) or codecs.lookup(encoding).name not in ("iso8859-1", "latin-1", "latin1"):
        raise UnsafePickleError(f"_codecs.encode with {encoding!r}: only Latin-1 byte strings are accepted")
    return text.encode("latin1")


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "Counter"): collections.Counter,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,  # pickles written by Python 2
    ("__builtin__", "frozenset"): frozenset,
    ("_codecs", "encode"): _latin1_encode,
}
"""The only globals a pickle may name: containers whose construction runs no code of the pickle's choosing."""

_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a legacy torch.save file


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            allowed = "dict, list, tuple, str, bytes, numbers, OrderedDict, Counter, set"
            raise UnsafePickleError(
                f"the pickle refers to {module}.{name}, which txl does not load "
                f"(only {allowed}): refused without running it"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(
            "the pickle holds tensors or other persistent objects (torch storages): refused"
        )


def _load_one(stream: io.BufferedIOBase) -> Any:
    return _RestrictedUnpickler(stream, encoding="latin1").load()


def safe_loads(data: bytes) -> Any:
    """Unpickle ``data`` (a pickle, a legacy ``torch.save`` file or a zipped one) building only the plain
    values of :data:`ALLOWED_GLOBALS`; anything else raises :class:`UnsafePickleError` before it is called."""
    if data[:2] == b"PK":  # torch.save's zip layout: the object is archive/data.pkl
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
                if len(names) != 1:
                    raise UnsafePickleError(
                        "a zip file that is not a torch.save archive (no single data.pkl)"
                    )
                data = archive.read(names[0])
        except zipfile.BadZipFile as exc:
            raise UnsafePickleError(f"a corrupt zip archive ({exc})") from None
    stream = io.BytesIO(data)
    try:
        obj = _load_one(stream)
        if (
            isinstance(obj, int) and obj == _TORCH_LEGACY_MAGIC
        ):  # legacy torch.save: magic, protocol, sys info, object
            _load_one(stream)
            _load_one(stream)
            obj = _load_one(stream)
    except UnsafePickleError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise UnsafePickleError(f"not a readable pickle ({type(exc).__name__}: {exc})") from None
    return obj


def safe_load_file(path: str | Path) -> Any:
    """:func:`safe_loads` of a file; the message of any error names the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnsafePickleError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return safe_loads(data)
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{path}: {exc}") from None
