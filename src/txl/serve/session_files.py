"""Sessions as files: the format of one session (its memory in safetensors, its metadata in JSON) checked against
the run served; the folder of ``txl serve --sessions-dir`` (a file set per session, written atomically, a lock
per session between servers, deleted when idle too long or to make room); one file that carries a session to
another server. Which sessions are held in RAM is :mod:`txl.serve.session_store`'s job."""

# A session in the folder, ID its id:
#   ID.json               its metadata; written last, it is the commit point of a save
#   ID.REV.safetensors    its memory, REV the revision that ID.json names (none before its memory exists)
#   ID.lock               locked (flock) while a request uses the session, by whichever server runs it
# A session as one file (download, upload): its memory in safetensors, the same JSON document in the header's
# metadata under "txl.session".
#
# Dimensions: L layers, M memory positions (at most the evaluation memory length), D model size.

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import Tensor

from ..checkpoint import MODEL_FILE, read_checkpoint_meta
from ..errors import CheckpointError
from ..files import atomic_open, sync_folder
from ..model import Memory
from ..runs import LoadedRun
from .openai import RequestError
from .score import scoring_lengths
from .sessions import CONTEXT_IDS, Session

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "SessionError",
    "RunIdentity",
    "run_identity",
    "check_id",
    "session_document",
    "session_from",
    "pack_session",
    "unpack_session",
    "SessionLock",
    "SessionFiles",
]

FORMAT = "txl-session"
"""The ``format`` field of every session document."""

FORMAT_VERSION = 1
"""The version of the session format this txl writes and reads."""

METADATA_KEY = "txl.session"
"""Where a session's one file keeps its JSON document: this key of the safetensors header's metadata."""

HEADER_LIMIT = 64 * 1024
"""Bytes a session file's header (its JSON document and tensor index) may take."""

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_STALE_TEMPORARY = 600.0  # seconds after which a temporary file is a killed write's, not one in progress
_STALE_MEMORY = 60.0  # seconds after which a memory file no document names is a killed save's


class SessionError(RequestError):
    """A session that cannot be used as asked: its HTTP status and a one-line message naming it."""

    def __init__(self, status: int, message: str) -> None:
        kinds = {404: "not_found_error", 429: "rate_limit_error", 507: "server_error"}
        super().__init__(status, message, kind=kinds.get(status, "invalid_request_error"))


def check_id(ident: Any) -> str:
    """``ident`` when it is a session id (a file name in the folder, nothing else); else a 400 naming it."""
    if not isinstance(ident, str) or not _ID.fullmatch(ident):
        shown = repr(ident)[:80] if isinstance(ident, str) else type(ident).__name__
        raise SessionError(
            400,
            f"session {shown}: not a session id (1 to 128 letters, digits, '-' or '_', starting with a "
            "letter or digit)",
        )
    return ident


# -- what a session belongs to --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunIdentity:
    """What a session file must match to be continued by a server: the weights and vocabulary it was read with,
    the shape and type of its memory, and the evaluation lengths of its readings."""

    weights: str
    """SHA-256 of the weights (the checkpoint's model.safetensors, as its state.json records it)."""
    vocab: str
    """The vocabulary's fingerprint."""
    vocab_size: int
    n_layer: int
    d_model: int
    dtype: str
    """The memory's element type (the model's: ``float32``, ``bfloat16``, ...)."""
    tgt_len: int
    """The evaluation segment length the session reads with."""
    mem_len: int
    """The evaluation memory length: the most positions a session's memory holds (M)."""
    clamp_len: int | None
    same_length: bool

    def lengths(self) -> dict[str, Any]:
        """The evaluation lengths, as a session document records them."""
        return {
            "tgt_len": self.tgt_len,
            "mem_len": self.mem_len,
            "clamp_len": self.clamp_len,
            "same_length": self.same_length,
        }

    @property
    def memory_bytes(self) -> int:
        """The bytes of the largest memory: L x M x D elements, and its reach."""
        itemsize = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return self.n_layer * self.mem_len * self.d_model * itemsize + 8

    @property
    def file_limit(self) -> int:
        """The largest session file of this run (its memory, and room for its header)."""
        return self.memory_bytes + HEADER_LIMIT + 8


def _weights_digest(run: LoadedRun) -> str:
    """SHA-256 of the weights served: the one the checkpoint's state.json records (checked when it was loaded),
    else of the weights' bytes in name order."""
    try:
        document = read_checkpoint_meta(run.checkpoint)
        recorded = document["files"][MODEL_FILE]["sha256"]
        if isinstance(recorded, str) and document["state"]["step"] == run.step:
            return recorded
    except (CheckpointError, KeyError, TypeError, OSError):
        pass
    digest = hashlib.sha256()
    for name, tensor in sorted(run.model.state_dict().items()):
        digest.update(name.encode("utf-8"))
        digest.update(_raw(tensor))
    return digest.hexdigest()


def _raw(tensor: Tensor) -> Any:
    """The bytes of a tensor, on the CPU, as a buffer (no copy when it is there and contiguous already)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def run_identity(run: LoadedRun) -> RunIdentity:
    """The identity of ``run`` as a server serves it (its weights, vocabulary and evaluation lengths)."""
    lengths = scoring_lengths(run.config, memory=True)
    config = run.config.model
    dtype = str(next(run.model.parameters()).dtype).removeprefix("torch.")
    return RunIdentity(
        weights=_weights_digest(run),
        vocab=run.vocab.fingerprint,
        vocab_size=len(run.vocab),
        n_layer=config.n_layer,
        d_model=config.d_model,
        dtype=dtype,
        tgt_len=lengths.tgt_len,
        mem_len=lengths.span.mem_len,
        clamp_len=lengths.span.clamp_len,
        same_length=lengths.span.same_length,
    )


# -- one session's document and tensors -----------------------------------------------------------------------


def _digest(tensors: dict[str, Tensor]) -> str:
    """SHA-256 of named tensors (names, shapes, types and bytes, in name order)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name]
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}\n".encode())
        digest.update(_raw(tensor))
    return digest.hexdigest()


def _tensors(memory: Memory | None) -> dict[str, Tensor]:
    """A memory's tensors on the CPU (``memory.0`` .. ``memory.{L-1}``, ``memory.reach``), none for None."""
    if memory is None:
        return {}
    return {name: t.detach().cpu().contiguous() for name, t in memory.state_dict().items()}


def session_document(
    session: Session, identity: RunIdentity, *, tensors: dict[str, Tensor], revision: str
) -> dict[str, Any]:
    """The JSON document of ``session`` (its memory's ``tensors`` given, for their length and checksum)."""
    memory = None
    if tensors:
        memory = {"length": int(tensors["memory.0"].shape[1]), "sha256": _digest(tensors)}
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "id": session.id,
        "revision": revision,
        "created": session.created,
        "run": {"weights": identity.weights, "vocab": identity.vocab, "vocab_size": identity.vocab_size},
        "lengths": identity.lengths(),
        "tokens_read": session.tokens_read,
        "pending": None if session.pending is None else int(session.pending),
        "recent": [int(i) for i in session.recent],
        "memory": memory,
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(digest: Any) -> str:
    return f"{str(digest)[:12]}..."


def _check_header(document: Any, identity: RunIdentity, name: str) -> tuple[str, str]:
    """The id and revision of a session document, after its format and the run it belongs to are checked."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise SessionError(400, f"{name}: not a txl session (no format {FORMAT!r})")
    version = document.get("version")
    if version != FORMAT_VERSION:
        newer = " (written by a newer txl)" if isinstance(version, int) and version > FORMAT_VERSION else ""
        raise SessionError(
            400, f"{name}: format version {version!r}{newer}; this server reads version {FORMAT_VERSION}"
        )
    ident = check_id(document.get("id"))
    name = f"session {ident!r}"
    run = document.get("run")
    if not isinstance(run, dict):
        raise SessionError(400, f"{name}: its document names no run")
    if run.get("weights") != identity.weights:
        raise SessionError(
            400,
            f"{name}: belongs to another run (weights {_short(run.get('weights'))}, this server's "
            f"{_short(identity.weights)})",
        )
    if run.get("vocab") != identity.vocab or run.get("vocab_size") != identity.vocab_size:
        raise SessionError(
            400,
            f"{name}: belongs to another run (vocabulary {_short(run.get('vocab'))}, this server's "
            f"{_short(identity.vocab)})",
        )
    if document.get("lengths") != identity.lengths():
        raise SessionError(
            400,
            f"{name}: read with other evaluation lengths ({document.get('lengths')}; this server reads with "
            f"{identity.lengths()})",
        )
    revision = document.get("revision")
    if not isinstance(revision, str) or not re.fullmatch(r"[0-9a-f]{16}", revision):
        raise SessionError(400, f"{name}: bad revision {str(revision)[:40]!r}")
    return ident, revision


def _check_memory(tensors: dict[str, Tensor], entry: Any, identity: RunIdentity, name: str) -> Memory | None:
    """The memory of a session's tensors, each checked against its document's ``entry`` and the run."""
    if entry is None:
        if tensors:
            raise SessionError(400, f"{name}: tensors {sorted(tensors)[:3]} where its document has no memory")
        return None
    if not isinstance(entry, dict) or not _is_int(entry.get("length")):
        raise SessionError(400, f"{name}: its document's memory entry is malformed")
    length = entry["length"]
    names = {f"memory.{i}" for i in range(identity.n_layer)}
    if set(tensors) - {"memory.reach"} != names:
        raise SessionError(
            400, f"{name}: its memory must have {identity.n_layer} layers, got tensors {sorted(tensors)[:6]}"
        )
    if entry.get("sha256") != _digest(tensors):
        raise SessionError(400, f"{name}: its memory is corrupt (the checksum differs from its document's)")
    if not 1 <= length <= identity.mem_len:
        raise SessionError(
            400, f"{name}: a memory of {length} positions; this run's holds 1 to {identity.mem_len}"
        )
    shape = (1, length, identity.d_model)
    for key in sorted(names):
        tensor = tensors[key]
        if tuple(tensor.shape) != shape or str(tensor.dtype) != f"torch.{identity.dtype}":
            got = f"{str(tensor.dtype).removeprefix('torch.')} {tuple(tensor.shape)}"
            raise SessionError(400, f"{name}: {key} is {got}, this run's memory {identity.dtype} {shape}")
        if not bool(torch.isfinite(tensor).all()):
            raise SessionError(400, f"{name}: {key} holds values that are not finite")
    reach = tensors.get("memory.reach")
    if reach is not None and (
        reach.dtype != torch.int64 or tuple(reach.shape) != (1,) or not 0 <= int(reach[0]) <= length
    ):
        raise SessionError(400, f"{name}: memory.reach must be one int64 in [0, {length}]")
    return Memory.from_state_dict(tensors)


def session_from(
    document: Any, tensors: dict[str, Tensor], identity: RunIdentity, *, name: str = "the session"
) -> Session:
    """The session of a JSON ``document`` and its memory's ``tensors``, each value checked against the run
    (``identity``); a :class:`SessionError` (400) whose message names the session for the first problem.
    ``name`` calls it until its id is read."""
    ident, revision = _check_header(document, identity, name)
    name = f"session {ident!r}"
    tokens_read, pending = document.get("tokens_read"), document.get("pending")
    recent = document.get("recent")
    if not _is_int(tokens_read) or tokens_read < 0:
        raise SessionError(400, f"{name}: tokens_read must be an integer >= 0, got {tokens_read!r}")
    size = identity.vocab_size
    if pending is not None and not (_is_int(pending) and 0 <= pending < size):
        raise SessionError(400, f"{name}: pending must be a token id in [0, {size}), got {pending!r}")
    if (pending is None) != (tokens_read == 0):
        raise SessionError(400, f"{name}: a pending token is there exactly when tokens were read")
    if (
        not isinstance(recent, list)
        or len(recent) > CONTEXT_IDS
        or not all(_is_int(i) and 0 <= i < size for i in recent)
    ):
        raise SessionError(400, f"{name}: recent must be up to {CONTEXT_IDS} token ids in [0, {size})")
    created = document.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
        raise SessionError(400, f"{name}: created must be a time in seconds, got {created!r}")
    memory = _check_memory(tensors, document.get("memory"), identity, name)
    return Session(
        id=ident,
        created=float(created),
        last_used=time.monotonic(),
        memory=memory,
        pending=pending,
        recent=list(recent),
        tokens_read=tokens_read,
        revision=revision,
    )


# -- one file: a session moved between servers ----------------------------------------------------------------


def pack_session(session: Session, identity: RunIdentity) -> bytes:
    """``session`` as one file: safetensors of its memory, its JSON document in the header's metadata."""
    tensors = _tensors(session.memory)
    revision = session.revision or secrets.token_hex(8)
    document = session_document(session, identity, tensors=tensors, revision=revision)
    return save_tensors(tensors, metadata={METADATA_KEY: json.dumps(document)})


def _header(data: bytes, name: str) -> dict[str, Any]:
    """The JSON header of safetensors bytes (its length checked before it is read)."""
    if len(data) < 8:
        raise SessionError(400, f"{name}: truncated ({len(data)} bytes; not a session file)")
    size = int.from_bytes(data[:8], "little")
    if size > HEADER_LIMIT or 8 + size > len(data):
        raise SessionError(400, f"{name}: truncated or not a session file (its header claims {size} bytes)")
    try:
        header = json.loads(data[8 : 8 + size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise SessionError(400, f"{name}: corrupt header ({exc})") from None
    if not isinstance(header, dict):
        raise SessionError(400, f"{name}: corrupt header (not a JSON object)")
    return header


def unpack_session(data: bytes, identity: RunIdentity) -> Session:
    """The session of one file made by :func:`pack_session`, checked (size, format, run, contents)."""
    name = "the uploaded session"
    if len(data) > identity.file_limit:
        raise SessionError(
            413,
            f"{name}: {len(data)} bytes, more than a session of this run takes ({identity.file_limit})",
        )
    metadata = _header(data, name).get("__metadata__")
    text = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if not isinstance(text, str):
        raise SessionError(400, f"{name}: not a txl session file (no {METADATA_KEY!r} metadata)")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise SessionError(400, f"{name}: corrupt document ({exc})") from None
    ident = document.get("id") if isinstance(document, dict) else None
    if isinstance(ident, str) and _ID.fullmatch(ident):
        name = f"session {ident!r}"
    try:
        tensors = load_tensors(data)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged bytes
        raise SessionError(400, f"{name}: truncated or corrupt ({exc})") from None
    return session_from(document, tensors, identity, name=name)


# -- the folder -----------------------------------------------------------------------------------------------


class SessionLock:
    """A session's lock file, held (``flock``, exclusive) until :meth:`release`."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def release(self) -> None:
        """Let go of the lock; its file goes too when the session has no document (deleted, or never made)."""
        import fcntl

        if self.fd < 0:
            return
        if not self.path.with_suffix(".json").exists():
            self.path.unlink(missing_ok=True)  # while locked: one who opened it meanwhile sees it gone
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = -1


def _put_bytes(fh: IO[bytes], data: bytes) -> None:
    """Write ``data`` to an open file (one place every session file's bytes go through)."""
    fh.write(data)


@dataclass
class _Entry:
    bytes: int
    mtime: float  # of its document: when it was last used


class SessionFiles:
    """The sessions kept in ``folder`` for a run (``identity``): read, written (atomically: the memory file,
    then the document that names it), locked while in use, and deleted when idle for ``ttl`` seconds or, the
    oldest idle first, to keep the folder under ``max_bytes``. Several servers of one run may share the folder.

    The folder's size is known from this server's writes and from its last look at the folder
    (:meth:`scan`, which :meth:`sweep` makes)."""

    def __init__(self, folder: Path, identity: RunIdentity, *, max_bytes: int, ttl: float) -> None:
        self.folder, self.identity, self.max_bytes, self.ttl = Path(folder), identity, max_bytes, ttl
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index: dict[str, _Entry] = {}
        self._loose = 0  # bytes of files no document names (a killed save's), removed by sweep
        self._guard = threading.Lock()
        self.scan()

    # -- paths and locks -------------------------------------------------------------------------------

    def document_path(self, ident: str) -> Path:
        """Where session ``ident``'s document is."""
        return self.folder / f"{check_id(ident)}.json"

    def memory_path(self, ident: str, revision: str) -> Path:
        """Where revision ``revision`` of session ``ident``'s memory is."""
        return self.folder / f"{check_id(ident)}.{revision}.safetensors"

    def lock(self, ident: str) -> SessionLock | None:
        """Lock session ``ident`` (its lock file made when missing); None when another holder has it."""
        import fcntl

        path = self.folder / f"{check_id(ident)}.lock"
        for _ in range(5):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return SessionLock(fd, path)
            os.close(fd)  # the session was deleted (its lock file with it) meanwhile: lock the new file
        return None

    # -- one session -----------------------------------------------------------------------------------

    def read_document(self, ident: str) -> dict[str, Any] | None:
        """Session ``ident``'s document, its format and run checked; None when there is none."""
        name = f"session {ident!r}"
        try:
            text = self.document_path(ident).read_bytes()
        except FileNotFoundError:
            return None
        try:
            document = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SessionError(400, f"{name}: its file {ident}.json is corrupt ({exc})") from None
        found, _ = _check_header(document, self.identity, name)
        if found != ident:
            raise SessionError(400, f"{name}: its file {ident}.json holds session {found}")
        return document

    def load(self, ident: str, document: dict[str, Any]) -> Session:
        """Session ``ident`` of ``document`` (from :meth:`read_document`) with its memory, all checked."""
        name = f"session {ident!r}"
        tensors: dict[str, Tensor] = {}
        if document.get("memory") is not None:
            path = self.memory_path(ident, document["revision"])
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise SessionError(400, f"{name}: its memory file {path.name} is missing") from None
            try:
                tensors = load_tensors(data)
            except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged bytes
                raise SessionError(
                    400, f"{name}: its memory file {path.name} is truncated or corrupt ({exc})"
                ) from None
        return session_from(document, tensors, self.identity, name=name)

    def save(self, session: Session) -> tuple[str, list[str]]:
        """Write ``session`` as a new revision (the caller holds its lock): its memory file, then its document,
        each atomically; then its previous memory file goes. Returns the new revision and the sessions deleted
        to make room. A failed write (a full disk) leaves the previous revision as it was."""
        ident, previous = session.id, session.revision
        tensors = _tensors(session.memory)
        revision = secrets.token_hex(8)
        document = session_document(session, self.identity, tensors=tensors, revision=revision)
        text = json.dumps(document).encode("utf-8")
        blob = save_tensors(tensors) if tensors else b""
        evicted = self.make_room(ident, len(text) + len(blob))
        memory = self.memory_path(ident, revision)
        try:
            if blob:
                with atomic_open(memory, "wb") as fh:
                    _put_bytes(fh, blob)
            with atomic_open(self.document_path(ident), "wb") as fh:
                _put_bytes(fh, text)
        except OSError as exc:
            memory.unlink(missing_ok=True)
            raise SessionError(507, f"session {ident!r}: not saved ({exc.strerror or exc})") from None
        sync_folder(self.folder)
        if previous and previous != revision:
            self.memory_path(ident, previous).unlink(missing_ok=True)
        with self._guard:
            self._index[ident] = _Entry(len(text) + len(blob), time.time())
        return revision, evicted

    def delete(self, ident: str) -> bool:
        """Delete session ``ident``'s document, then the memory file it names (the caller holds its lock, whose
        file goes as it lets go); False when there was none."""
        path = self.document_path(ident)
        try:
            document = json.loads(path.read_bytes())
        except FileNotFoundError:
            with self._guard:
                self._index.pop(ident, None)
            return False
        except (ValueError, UnicodeDecodeError):
            document = None
        path.unlink(missing_ok=True)
        revision = document.get("revision") if isinstance(document, dict) else None
        if isinstance(revision, str) and re.fullmatch(r"[0-9a-f]{16}", revision):
            self.memory_path(ident, revision).unlink(missing_ok=True)
        else:  # a damaged document names none: every memory file of the session goes
            for memory in self.folder.glob(f"{ident}.*.safetensors"):
                memory.unlink(missing_ok=True)
        with self._guard:
            self._index.pop(ident, None)
        return True

    def touch(self, ident: str) -> None:
        """Session ``ident`` was used: its idle time starts again."""
        try:
            os.utime(self.document_path(ident))
        except FileNotFoundError:
            return
        with self._guard:
            if ident in self._index:
                self._index[ident].mtime = time.time()

    # -- the folder ------------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Sessions in the folder."""
        return len(self._index)

    @property
    def total_bytes(self) -> int:
        """Bytes of the session files in the folder."""
        with self._guard:
            return sum(entry.bytes for entry in self._index.values()) + self._loose

    def scan(self) -> tuple[dict[str, list[Path]], list[Path]]:
        """Look at the folder again: each session's size and last use. Returns what a killed write may have
        left: the memory files of each session that has several or no document, and the temporary files."""
        index: dict[str, _Entry] = {}
        memories: dict[str, list[Path]] = {}
        sizes: dict[str, int] = {}
        temporaries = []
        with os.scandir(self.folder) as entries:
            for entry in entries:
                ident, _, rest = entry.name.partition(".")
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    temporaries.append(Path(entry.path))
                if entry.name.startswith(".") or not _ID.fullmatch(ident):
                    continue
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                if rest == "json":
                    index[ident] = _Entry(0, stat.st_mtime)
                    sizes[ident] = sizes.get(ident, 0) + stat.st_size
                elif rest.endswith(".safetensors"):
                    memories.setdefault(ident, []).append(Path(entry.path))
                    sizes[ident] = sizes.get(ident, 0) + stat.st_size
        for ident, found in index.items():
            found.bytes = sizes.pop(ident)
        with self._guard:
            self._index, self._loose = index, sum(sizes.values())
        suspects = {k: paths for k, paths in memories.items() if len(paths) > 1 or k not in index}
        return suspects, temporaries

    def make_room(self, ident: str, size: int) -> list[str]:
        """Delete the oldest idle sessions (not ``ident``, not one locked) until ``size`` more bytes fit under
        ``max_bytes``; returns their ids."""
        with self._guard:
            others = {k: e for k, e in self._index.items() if k != ident}
            total = sum(e.bytes for e in others.values()) + self._loose
        evicted = []
        for _, victim in sorted((e.mtime, k) for k, e in others.items()):
            if total + size <= self.max_bytes:
                break
            if self._delete_idle(victim, before=None):
                total -= others[victim].bytes
                evicted.append(victim)
        return evicted

    def _delete_idle(self, ident: str, *, before: float | None) -> bool:
        """Delete session ``ident`` unless it is locked (in use) or, with ``before``, used since then."""
        lock = self.lock(ident)
        if lock is None:
            return False
        try:
            try:
                if before is not None and self.document_path(ident).stat().st_mtime >= before:
                    return False
            except FileNotFoundError:
                pass
            return self.delete(ident)
        finally:
            lock.release()

    def sweep(self) -> list[str]:
        """Look at the folder: delete the sessions idle for longer than the ttl (not one in use) and the files of
        killed writes; returns the ids of the sessions deleted."""
        memories, temporaries = self.scan()
        deadline = time.time() - self.ttl
        with self._guard:
            old = [k for k, e in self._index.items() if e.mtime < deadline]
        expired = [ident for ident in old if self._delete_idle(ident, before=deadline)]
        self._remove_loose(memories, temporaries)
        return expired

    def _remove_loose(self, memories: dict[str, list[Path]], temporaries: list[Path]) -> None:
        """Delete the memory files no document names and the temporary files of writes killed long ago."""
        now = time.time()
        for ident, paths in memories.items():
            stale = [p for p in paths if _age(p, now) > _STALE_MEMORY]
            if not stale or (lock := self.lock(ident)) is None:
                continue
            try:
                try:
                    named = json.loads(self.document_path(ident).read_bytes()).get("revision")
                except (OSError, ValueError, UnicodeDecodeError, AttributeError):
                    named = None
                for path in stale:
                    if path.name != f"{ident}.{named}.safetensors":
                        path.unlink(missing_ok=True)
            finally:
                lock.release()
        for path in temporaries:  # atomic_open's, of a write killed long ago
            if _age(path, now) > _STALE_TEMPORARY:
                path.unlink(missing_ok=True)


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
