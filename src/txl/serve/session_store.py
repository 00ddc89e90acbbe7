"""Where the sessions of ``txl serve`` live: in RAM (:class:`~txl.serve.sessions.SessionStore`) and, with
``--sessions-dir``, on disk too (:class:`~txl.serve.session_files.SessionFiles`). :class:`SessionKeeper` is what the
session routes call: open (and claim), save after a request, release, create, delete, fork, download, upload,
expire. It knows no HTTP beyond the status of each refusal."""

# With a folder, disk holds every session and RAM the ones in use and up to --max-sessions recent ones. A request
# claims its session: busy here, and its lock file locked (another server sharing the folder gets a 409); the
# session's document is read and, when another server has changed it since, the session is read again. After
# the request a changed session is written (a new revision, atomically), before its answer goes out; a write
# that fails undoes the request's change, so that RAM and disk never differ.

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from ..model import Memory
from .session_files import (
    RunIdentity,
    SessionError,
    SessionFiles,
    SessionLock,
    check_id,
    pack_session,
    unpack_session,
)
from .sessions import Session, SessionStore

__all__ = ["SessionKeeper"]


@dataclass
class _Claim:
    """A request's hold on a session: its lock (with a folder) and the session as it was before the request."""

    lock: SessionLock | None
    memory: Memory | None
    pending: int | None
    recent: list[int]
    tokens_read: int

    @classmethod
    def of(cls, session: Session, lock: SessionLock | None) -> _Claim:
        return cls(lock, session.memory, session.pending, list(session.recent), session.tokens_read)

    def undo(self, session: Session) -> None:
        """Put ``session`` back as it was when claimed."""
        session.memory, session.pending = self.memory, self.pending
        session.recent, session.tokens_read = list(self.recent), self.tokens_read


def _copy(memory: Memory | None) -> Memory | None:
    return None if memory is None else Memory(tuple(s.clone() for s in memory.states), memory.reach)


def _not_found(ident: str) -> SessionError:
    return SessionError(404, f"no session {ident!r} (never made, deleted, or expired)")


def _busy(ident: str) -> SessionError:
    return SessionError(409, f"session {ident!r} is busy with another request; retry when it ends")


def _assign(session: Session, source: Session) -> None:
    """``session`` (held in RAM) takes what ``source`` (read from its files) holds."""
    session.memory, session.pending, session.recent = source.memory, source.pending, source.recent
    session.tokens_read, session.created = source.tokens_read, source.created
    session.revision = source.revision


class SessionKeeper:
    """The sessions of one server: ``store`` in RAM, and ``files`` on disk (None: RAM only). ``identity``: the
    run served (for the files of sessions moved between servers); ``device``: where memories are put."""

    def __init__(
        self,
        store: SessionStore,
        *,
        identity: RunIdentity,
        files: SessionFiles | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.store, self.identity, self.files, self.device = store, identity, files, torch.device(device)
        self._claims: dict[str, _Claim] = {}
        self._closing: set[asyncio.Task] = set()

    @property
    def upload_limit(self) -> int:
        """The largest session file an upload may be."""
        return self.identity.file_limit

    def describe(self, session: Session) -> dict[str, Any]:
        """The session as ``GET /v1/sessions/{id}`` shows it."""
        return session.describe(ttl=self.store.ttl)

    # -- a request's session -----------------------------------------------------------------------------

    async def open(self, ident: str, *, claim: bool = False) -> Session:
        """Session ``ident`` (404 unknown, 400 a file that cannot be read); ``claim``: for a request, which
        holds it until :meth:`release` (409 while another request, here or on another server, has it)."""
        check_id(ident)
        if self.files is None:
            session = self.store.get(ident)
            if session is None:
                raise _not_found(ident)
            if claim:
                if not self.store.claim(session):
                    raise _busy(ident)
                self._claims[ident] = _Claim.of(session, None)
            return session
        opening = asyncio.ensure_future(asyncio.to_thread(self._open_file, ident, claim))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:  # the request is gone: a session claimed meanwhile is let go
            if claim:
                opening.add_done_callback(self._let_go)
            raise

    def _let_go(self, opening: asyncio.Future) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self.release(opening.result())

    def _open_file(self, ident: str, claim: bool) -> Session:
        files = self.files
        assert files is not None
        held = self.store.get(ident)
        lock = None
        if claim:
            if held is not None and not self.store.claim(held):
                raise _busy(ident)
            lock = files.lock(ident)
            if lock is None:
                if held is not None:
                    self.store.release(held)
                raise _busy(ident)
        try:
            session = self._current(ident, held, claim)
        except BaseException:
            if lock is not None:
                lock.release()
            if held is not None and claim:
                self.store.release(held)
            raise
        if claim:
            self._claims[ident] = _Claim.of(session, lock)
        else:
            files.touch(ident)
        return session

    def _current(self, ident: str, held: Session | None, claimed: bool) -> Session:
        """Session ``ident`` as its files hold it now: ``held`` (RAM) when it is that revision, else read again;
        the files are the truth (gone: 404, and RAM lets it go)."""
        files = self.files
        assert files is not None
        if held is not None and held.busy and not claimed:
            return held  # a request here uses it: RAM is ahead of its files until the request ends
        document = files.read_document(ident)
        for _ in range(3):
            if document is None:
                if held is not None:
                    self.store.forget(ident)
                raise _not_found(ident)
            if held is not None and held.revision == document["revision"]:
                return held
            try:
                loaded = files.load(ident, document)
                break
            except SessionError:
                again = files.read_document(ident)
                if claimed or (again is not None and again["revision"] == document["revision"]):
                    raise
                document = again  # another server saved it while it was read: read the new revision
        else:
            raise _busy(ident)
        if loaded.memory is not None:
            loaded.memory = loaded.memory.to(self.device)
        if held is None:
            loaded.busy = claimed
            if not (self.store.make_room() and self.store.add(loaded)):
                raise self._full()
            return loaded
        _assign(held, loaded)
        return held

    async def save(self, session: Session) -> None:
        """Write a claimed session that the request changed (nothing to do without a folder or a change); a
        write that fails undoes the change (507)."""
        claim = self._claims.get(session.id)
        if claim is None or session.tokens_read == claim.tokens_read:
            return
        if self.files is not None:
            try:
                await asyncio.to_thread(self._write, session)
            except SessionError:
                claim.undo(session)
                raise
        self._claims[session.id] = _Claim.of(session, claim.lock)

    def release(self, session: Session) -> None:
        """The request using ``session`` is over (after :meth:`save`)."""
        claim = self._claims.pop(session.id, None)
        if claim is not None and claim.lock is not None:
            if self.files is not None:
                self.files.touch(session.id)
            claim.lock.release()
        self.store.release(session)

    async def finish(self, session: Session) -> None:
        """:meth:`save` (a failure is already undone), then :meth:`release`."""
        try:
            await self.save(session)
        except SessionError:
            pass
        finally:
            self.release(session)

    def finish_later(self, session: Session) -> None:
        """:meth:`finish` as a task of the running event loop (from a callback that cannot wait)."""
        task = asyncio.get_running_loop().create_task(self.finish(session))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- sessions made, moved, deleted -------------------------------------------------------------------

    def _full(self) -> SessionError:
        if self.files is None:
            message = (
                f"there are {self.store.limit} sessions already (the server's max_sessions); delete one or "
                "wait for idle ones to expire"
            )
        else:
            message = (
                f"the {self.store.limit} sessions held in memory are all in use (the server's max_sessions); "
                "retry when one ends"
            )
        return SessionError(429, message)

    def _write(self, session: Session) -> None:
        """Write ``session`` (its lock held) and let go of the sessions deleted to make room."""
        assert self.files is not None
        revision, evicted = self.files.save(session)
        session.revision = revision
        for ident in evicted:
            self.store.forget(ident)
        self.store.counts.evicted += len(evicted)

    def _adopt(self, session: Session, *, new: bool) -> None:
        """Hold a session made here (``new``: counted as created by the store already) or read from a file:
        in RAM, and written to the folder (409 when its id is taken)."""
        if self.files is None:
            if not new:
                if self.store.get(session.id) is not None:
                    raise SessionError(409, f"session {session.id!r} exists here already (delete it first)")
                if not self.store.add(session):
                    raise self._full()
            return
        lock = self.files.lock(session.id)
        if lock is None or (not new and self.files.document_path(session.id).exists()):
            if lock is not None:
                lock.release()
            raise SessionError(409, f"session {session.id!r} exists here already (delete it first)")
        try:
            session.revision = ""
            if not new and not (self.store.make_room() and self.store.add(session)):
                raise self._full()
            try:
                self._write(session)
            except SessionError:
                self.store.forget(session.id)
                raise
        finally:
            lock.release()

    async def create(self) -> Session:
        """A new session (429 when the sessions held in memory are all in use, or too many without a folder)."""
        if self.files is not None and not self.store.make_room():
            raise self._full()
        session = self.store.create(f"sess-{uuid.uuid4().hex[:24]}")
        if session is None:
            raise self._full()
        if self.files is not None:
            await asyncio.to_thread(self._adopt, session, new=True)
        return session

    async def delete(self, ident: str) -> None:
        """Delete session ``ident`` (404 unknown, 409 while a request uses it)."""
        check_id(ident)
        if self.files is None:
            if self.store.get(ident) is None:
                raise _not_found(ident)
            if self.store.delete(ident) is None:
                raise _busy(ident)
            return
        await asyncio.to_thread(self._delete_file, ident)

    def _delete_file(self, ident: str) -> None:
        assert self.files is not None
        held = self.store.get(ident)
        if held is not None and held.busy:
            raise _busy(ident)
        lock = self.files.lock(ident)
        if lock is None:
            raise _busy(ident)
        try:
            found = self.files.delete(ident)
            self.store.forget(ident)
        finally:
            lock.release()
        if not found:
            raise _not_found(ident)

    async def fork(self, ident: str) -> Session:
        """A new session holding a copy of session ``ident``'s memory and place: both go on as it would."""
        source = await self.open(ident, claim=True)
        try:
            copy = Session(
                id=f"sess-{uuid.uuid4().hex[:24]}",
                created=time.time(),
                last_used=time.monotonic(),
                memory=_copy(source.memory),
                pending=source.pending,
                recent=list(source.recent),
                tokens_read=source.tokens_read,
            )
            if self.files is None:
                self._adopt(copy, new=False)
            else:
                await asyncio.to_thread(self._adopt, copy, new=False)
            self.store.counts.created += 1
            return copy
        finally:
            self.release(source)

    async def download(self, ident: str) -> bytes:
        """Session ``ident`` as one file (:func:`~txl.serve.session_files.pack_session`)."""
        session = await self.open(ident, claim=True)
        try:
            return await asyncio.to_thread(pack_session, session, self.identity)
        finally:
            self.release(session)

    async def upload(self, data: bytes) -> Session:
        """The session of a file made by :meth:`download` (here or on another server of the same run), held
        under its id (409 when that id is taken)."""
        session = await asyncio.to_thread(unpack_session, data, self.identity)
        if session.memory is not None:
            session.memory = session.memory.to(self.device)
        if self.files is None:
            self._adopt(session, new=False)
        else:
            await asyncio.to_thread(self._adopt, session, new=False)
        self.store.counts.created += 1
        return session

    # -- upkeep ------------------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Forget the sessions idle for longer than the ttl (with a folder: delete their files, and those of
        writes that were killed)."""
        if self.files is None:
            self.store.expire()
            return
        expired = await asyncio.to_thread(self.files.sweep)
        for ident in expired:
            self.store.forget(ident)
        self.store.counts.expired += len(expired)

    def health(self) -> dict[str, Any]:
        """The sessions' figures of ``GET /v1/health``: held (with a folder: on disk), in memory, created,
        expired, deleted to make room, and the folder's bytes and bound (None without a folder)."""
        counts, files = self.store.counts, self.files
        if files is None:
            self.store.expire()
        return {
            "sessions": len(self.store) if files is None else files.count,
            "sessions_in_memory": len(self.store),
            "sessions_created": counts.created,
            "sessions_expired": counts.expired,
            "sessions_evicted": counts.evicted,
            "sessions_disk_bytes": None if files is None else files.total_bytes,
            "sessions_max_bytes": None if files is None else files.max_bytes,
        }
