"""Sessions of ``txl serve`` kept on disk (``--sessions-dir``), forked and moved: a session continued by a server
started again on its folder gives exactly what the same server gives without the restart (greedy and seeded);
a write that fails half-way leaves the last revision intact; the memory's reach survives; two servers on one
folder never use one session at once and each sees the other's changes; a fork and a moved session go on as the
original; a bad file (truncated, corrupt, another format version, another run, oversized, an id that leaves the
folder) is a 4xx naming the session while the others go on; idle sessions expire and the oldest are deleted to
stay under the size bound. The references are servers that hold the same sessions in RAM only."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
pytest.importorskip("httpx", reason="the API tests need httpx")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from serve_helpers import train_char_run, wait_for  # noqa: E402
from txl.files import temporaries_of  # noqa: E402
from txl.model import Memory  # noqa: E402
from txl.runs import load_run  # noqa: E402
from txl.serve import session_files  # noqa: E402
from txl.serve.app import create_app  # noqa: E402
from txl.serve.session_files import SessionError, SessionFiles, pack_session, run_identity  # noqa: E402
from txl.serve.session_store import SessionKeeper  # noqa: E402
from txl.serve.sessions import Session, SessionStore  # noqa: E402
from txl.serve.state import ServeSettings  # noqa: E402
from txl.serve.work import read_tokens  # noqa: E402

SOURCE = (Path(__file__).parent / "serve_helpers.py").read_text(encoding="utf-8")
READ = SOURCE[:129]  # two evaluation segments, more than the evaluation memory (48 positions)
GREEDY = {"max_tokens": 12, "temperature": 0, "logprobs": 0}
SEEDED = {"max_tokens": 12, "temperature": 1.0, "seed": 7, "logprobs": 0}
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_char_run(tmp_path_factory.mktemp("persist"), steps=30, overrides=("eval.mem_len=48",))


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


def _server(run, run_dir, folder: Path | None = None, **settings) -> TestClient:
    limits = ServeSettings(sessions_dir=folder, **settings)
    return TestClient(create_app(run, run_dir=run_dir, settings=limits))


def _new(client, *texts: str) -> str:
    sid = client.post("/v1/sessions").json()["id"]
    for text in texts:
        assert client.post(f"/v1/sessions/{sid}/score", json={"text": text}).status_code == 200
    return sid


def _complete(client, sid: str, prompt: str, sampling: dict) -> tuple[str, list[float]]:
    answer = client.post(f"/v1/sessions/{sid}/completions", json={"prompt": prompt, **sampling})
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def _scores(client, sid: str, text: str) -> list[float | None]:
    answer = client.post(f"/v1/sessions/{sid}/score", json={"text": text})
    assert answer.status_code == 200, answer.text
    return [t["logprob"] for t in answer.json()["tokens"]]


def _go_on(client, sid: str) -> list:
    """What a session gives from here: a greedy completion, a seeded one, then a text scored."""
    return [
        _complete(client, sid, "\ndef ", GREEDY),
        _complete(client, sid, "", SEEDED),
        _scores(client, sid, "(text, width)"),
    ]


def _reference(run, run_dir, *texts: str, prompt: str = "") -> list:
    """The same requests on a server that holds its sessions in RAM and is never stopped."""
    with _server(run, run_dir) as c:
        sid = _new(c, *texts)
        if prompt:
            _complete(c, sid, prompt, GREEDY)
        return _go_on(c, sid)


def _document_of(data: bytes) -> dict:
    """The JSON document in a session file's safetensors header."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(json.loads(data[8 : 8 + size])["__metadata__"]["txl.session"])


def _error(answer, status: int, *words: str) -> str:
    assert answer.status_code == status, (answer.status_code, answer.text)
    message = answer.json()["error"]["message"]
    assert "\n" not in message and all(w in message for w in words), message
    return message


# -- a restart ------------------------------------------------------------------------------------------------


def test_a_session_continues_after_a_restart_exactly_as_without_it(run, run_dir, tmp_path):
    folder = tmp_path / "sessions"
    with _server(run, run_dir, folder) as first:
        sid = _new(first, READ)
        _complete(first, sid, "import ", GREEDY)
        before = first.get(f"/v1/sessions/{sid}").json()
    with _server(run, run_dir, folder) as again:  # a new server on the same folder
        assert again.get(f"/v1/sessions/{sid}").json()["tokens_read"] == before["tokens_read"]
        after = _go_on(again, sid)
    assert after == _reference(run, run_dir, READ, prompt="import ")
    files = sorted(p.name for p in folder.iterdir())
    assert files[-2:] == [f"{sid}.json", f"{sid}.lock"] and files[0].startswith(sid + ".")
    assert len(files) == 3 and files[0].endswith(".safetensors")  # one memory file: the last revision's


def test_the_files_hold_what_the_session_holds_the_reach_too(run, tmp_path):
    identity = run_identity(run)
    files = SessionFiles(tmp_path, identity, max_bytes=1 << 20, ttl=60.0)
    states = tuple(torch.randn(1, 20, run.config.model.d_model) for _ in range(run.config.model.n_layer))
    session = Session("sess-a", created=12.5, last_used=0.0, pending=7, recent=[1, 2, 3], tokens_read=40)
    session.memory = Memory(states, reach=torch.tensor([5]))
    session.revision, _ = files.save(session)
    back = files.load("sess-a", files.read_document("sess-a"))
    assert (back.id, back.created, back.pending, back.recent, back.tokens_read, back.revision) == (
        "sess-a",
        12.5,
        7,
        [1, 2, 3],
        40,
        session.revision,
    )
    assert all(torch.equal(a, b) for a, b in zip(back.memory.states, states, strict=True))
    assert back.memory.reach is not None and back.memory.reach.tolist() == [5]


def _drain(work):
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value


def test_an_uploaded_memory_with_a_reach_reads_as_that_memory(run, run_dir):
    """A memory whose reach covers 5 of its 20 positions (a document started there): the session reads after
    those 5 only, as the model reads after that memory, and not as after all 20."""
    reading = _drain(
        read_tokens(run, run.vocab.encode(READ[:21]), memory=None, pending=None, log_probs=False)
    )
    memory = Memory(reading.memory.states, reach=torch.tensor([5]))
    session = Session("sess-reach", created=1.0, last_used=0.0, pending=reading.pending, tokens_read=21)
    session.memory, session.recent = memory, [int(i) for i in run.vocab.encode(READ[13:21])]
    text = READ[21:60]

    def expected(m: Memory) -> list[float]:
        after = _drain(
            read_tokens(run, run.vocab.encode(text), memory=m, pending=reading.pending, log_probs=False)
        )
        return [-x for x in after.losses]

    # the same place with a memory of the 5 positions in reach only
    alone = Session("sess-alone", created=1.0, last_used=0.0, pending=reading.pending, tokens_read=21)
    alone.memory = Memory(tuple(s[:, -5:] for s in memory.states))
    alone.recent = session.recent
    with _server(run, run_dir) as c, _server(run, run_dir) as d:
        for one in (session, alone):
            data = pack_session(one, run_identity(run))
            assert (
                c.post("/v1/sessions", content=data).status_code
                == d.post("/v1/sessions", content=data).status_code
                == 200
            )
        got = _scores(c, "sess-reach", text)
        assert got == pytest.approx(_scores(c, "sess-alone", text), abs=1e-5)
        # a completion continues the last 16 positions (the model's memory length), 5 of them in reach
        ours, theirs = (_complete(d, one.id, "", {**GREEDY, "max_tokens": 24}) for one in (session, alone))
    assert got == pytest.approx(expected(memory), abs=1e-6)
    assert got != pytest.approx(expected(Memory(memory.states)), abs=1e-3)
    assert ours[0] == theirs[0] and ours[1] == pytest.approx(theirs[1], abs=1e-5)


# -- atomic writes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["memory", "document"])
def test_a_write_that_fails_half_way_leaves_the_last_revision(run, run_dir, tmp_path, monkeypatch, which):
    """The disk fills while the memory file, or the document, is being written: the request gets a 507 and is
    undone, every file is as it was (nothing written in place), no temporary is left, and the session goes on
    (here and after a restart) as if the failed request had never come."""
    folder = tmp_path / "sessions"
    with _server(run, run_dir, folder) as c:
        sid = _new(c, READ)
        saved = {p.name: p.read_bytes() for p in folder.iterdir()}
        real = session_files._put_bytes

        def half(fh, data: bytes) -> None:
            if (which == "document") == data.startswith(b"{"):
                fh.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fh, data)

        monkeypatch.setattr(session_files, "_put_bytes", half)
        _error(c.post(f"/v1/sessions/{sid}/score", json={"text": "more text"}), 507, sid, "not saved")
        _error(c.post(f"/v1/sessions/{sid}/completions", json={"prompt": "x", **GREEDY}), 507, sid)
        monkeypatch.setattr(session_files, "_put_bytes", real)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == saved
        assert not [t for name in saved for t in temporaries_of(folder / name)]
        assert c.get(f"/v1/sessions/{sid}").json()["tokens_read"] == len(READ)
        here = _go_on(c, sid)
    with _server(run, run_dir, folder) as again:
        sid2 = _new(again, READ)  # the same state, read into a second session of the folder
        assert _go_on(again, sid2) == here
    assert here == _reference(run, run_dir, READ)


def test_what_killed_writes_leave_is_tidied_and_the_session_stays(run, tmp_path):
    """A save killed after its memory file (a second memory file no document names), a session killed while it
    was made (a memory file without a document), a temporary file: the sweep deletes them once they are old,
    never the files a document names."""
    files = SessionFiles(tmp_path, run_identity(run), max_bytes=1 << 20, ttl=3600.0)
    states = tuple(torch.randn(1, 8, run.config.model.d_model) for _ in range(run.config.model.n_layer))
    session = Session("sess-kept", created=1.0, last_used=0.0, pending=3, recent=[3], tokens_read=9)
    session.memory = Memory(states)
    session.revision, _ = files.save(session)
    named = sorted(p.name for p in tmp_path.iterdir())
    leftovers = [
        tmp_path / "sess-kept.0123456789abcdef.safetensors",
        tmp_path / "sess-gone.0123456789abcdef.safetensors",
        tmp_path / ".sess-kept.json.0badc0de.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"half")
    files.sweep()
    assert all(path.exists() for path in leftovers)  # young: perhaps a write in progress
    for path in tmp_path.iterdir():  # all old, the files the document names too
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    os.utime(tmp_path / "sess-kept.json")  # used now: not expired
    files.sweep()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock") == named
    back = files.load("sess-kept", files.read_document("sess-kept"))
    assert all(torch.equal(a, b) for a, b in zip(back.memory.states, states, strict=True))


def test_a_session_is_saved_before_its_answer_goes_out(run, run_dir, tmp_path):
    """The last event of a streamed session completion (and a whole answer) goes out once the session is on
    disk: a server killed after its client saw the end has kept the request."""
    folder = tmp_path / "sessions"
    with _server(run, run_dir, folder) as c:
        sid = _new(c, READ)
        body = {"prompt": "\ndef ", "max_tokens": 20, "temperature": 0, "stream": True}
        with c.stream("POST", f"/v1/sessions/{sid}/completions", json=body) as streamed:
            for line in streamed.iter_lines():
                if '"finish_reason":"length"' in line:
                    read = json.loads((folder / f"{sid}.json").read_text())["tokens_read"]
                    assert read == json.loads(line[5:])["session"]["tokens_read"] == len(READ) + 5 + 20
                    break
            else:
                raise AssertionError("no last event")
        answer = c.post(f"/v1/sessions/{sid}/score", json={"text": "abc"}).json()
        assert json.loads((folder / f"{sid}.json").read_text())["tokens_read"] == answer["tokens_read"]


def test_a_claim_whose_request_is_gone_is_let_go(run, tmp_path):
    """A request cancelled while its session is being claimed (read from disk, locked): once the claim is
    made, it is let go; the next request gets the session, not a 409."""
    identity = run_identity(run)
    files = SessionFiles(tmp_path, identity, max_bytes=1 << 20, ttl=60.0)
    keeper = SessionKeeper(SessionStore(limit=4, ttl=60.0), identity=identity, files=files)

    async def main() -> None:
        session = await keeper.create()
        opening = asyncio.ensure_future(keeper.open(session.id, claim=True))
        await asyncio.sleep(0)  # the claim has started on its thread
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        deadline = time.monotonic() + 10
        while True:
            try:
                again = await keeper.open(session.id, claim=True)
                break
            except SessionError as exc:
                assert exc.status == 409 and time.monotonic() < deadline
                await asyncio.sleep(0.02)
        keeper.release(again)

    asyncio.run(main())


# -- two servers, one folder ----------------------------------------------------------------------------------


def test_two_servers_on_one_folder_never_use_a_session_at_once(run_dir, tmp_path):
    folder = tmp_path / "shared"
    run_a, run_b = load_run(run_dir), load_run(run_dir)
    with _server(run_a, run_dir, folder) as a, _server(run_b, run_dir, folder) as b:
        sid = _new(a, READ)
        assert b.get(f"/v1/sessions/{sid}").json()["tokens_read"] == len(READ)  # b holds it now too
        body = {"prompt": "\nclass ", "max_tokens": 300, "temperature": 0, "stream": True}
        with a.stream("POST", f"/v1/sessions/{sid}/completions", json=body) as streamed:
            lines = streamed.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            _error(b.post(f"/v1/sessions/{sid}/score", json={"text": "x"}), 409, sid, "busy")
            _error(b.post(f"/v1/sessions/{sid}/fork"), 409, sid)
            _error(b.delete(f"/v1/sessions/{sid}"), 409, sid)
            assert b.get(f"/v1/sessions/{sid}").status_code == 200  # showing it needs no lock
            events = [first] + [line for line in lines if line.startswith("data:")]
            text = "".join(json.loads(e[5:])["choices"][0]["text"] for e in events[:-2])  # before the end
        # b reads it again (a changed it), and goes on as a server that did both
        assert b.get(f"/v1/sessions/{sid}").json()["tokens_read"] == len(READ + "\nclass " + text)
        after = _go_on(b, sid)
    with _server(run_a, run_dir) as c:
        ref = _new(c, READ)
        assert _complete(c, ref, "\nclass ", {**GREEDY, "max_tokens": 300})[0] == text
        assert _go_on(c, ref) == after


# -- fork and move --------------------------------------------------------------------------------------------


def test_a_fork_and_its_original_go_on_as_the_original_would(run, run_dir, tmp_path):
    expected = _reference(run, run_dir, READ, prompt="import ")
    with _server(run, run_dir, tmp_path / "sessions") as c:
        sid = _new(c, READ)
        _complete(c, sid, "import ", GREEDY)
        fork = c.post(f"/v1/sessions/{sid}/fork").json()
        assert fork["id"] != sid and fork["tokens_read"] == c.get(f"/v1/sessions/{sid}").json()["tokens_read"]
        assert _go_on(c, fork["id"]) == expected
        assert _go_on(c, sid) == expected
        _error(c.post("/v1/sessions/sess-nope/fork"), 404, "sess-nope")


def test_a_session_moves_to_another_server_of_the_run_as_one_file(run, run_dir, tmp_path):
    with _server(run, run_dir, tmp_path / "a") as a, _server(run, run_dir, tmp_path / "b") as b:
        sid = _new(a, READ)
        _complete(a, sid, "import ", GREEDY)
        answer = a.get(f"/v1/sessions/{sid}/state")
        assert answer.headers["content-type"] == "application/octet-stream"
        data = answer.content
        document = _document_of(data)
        assert (document["format"], document["version"], document["id"]) == ("txl-session", 1, sid)
        assert b.post("/v1/sessions", content=data).json()["id"] == sid
        _error(b.post("/v1/sessions", content=data), 409, sid, "exists")
        there = _go_on(b, sid)
        assert _go_on(a, sid) == there  # the original goes on as the moved one
    with _server(run, run_dir) as ram:  # a server without a folder takes it too
        assert ram.post("/v1/sessions", content=data, headers={"content-type": "application/octet-stream"})
        assert _go_on(ram, sid) == there


# -- bad files ------------------------------------------------------------------------------------------------


def _memory_file(folder: Path, sid: str) -> Path:
    return next(folder.glob(f"{sid}.*.safetensors"))


def _edit_document(folder: Path, sid: str, change) -> None:
    path = folder / f"{sid}.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-50] ^= 0x10
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated memory": (lambda f, s: _truncate(_memory_file(f, s)), "truncated or corrupt"),
    "corrupt memory": (lambda f, s: _flip(_memory_file(f, s)), "corrupt"),
    "missing memory": (lambda f, s: _memory_file(f, s).unlink(), "missing"),
    "truncated document": (lambda f, s: _truncate(f / f"{s}.json"), "corrupt"),
    "another format version": (
        lambda f, s: _edit_document(f, s, lambda d: d.update(version=2)),
        "format version 2",
    ),
    "another run's weights": (
        lambda f, s: _edit_document(f, s, lambda d: d["run"].update(weights="0" * 64)),
        "another run (weights",
    ),
    "another vocabulary": (
        lambda f, s: _edit_document(f, s, lambda d: d["run"].update(vocab="0" * 64)),
        "another run (vocabulary",
    ),
    "other evaluation lengths": (
        lambda f, s: _edit_document(f, s, lambda d: d["lengths"].update(mem_len=64)),
        "evaluation lengths",
    ),
    "a bad pending token": (
        lambda f, s: _edit_document(f, s, lambda d: d.update(pending=10**6)),
        "pending",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_session_file_is_a_4xx_and_nothing_else_is_lost(run, run_dir, tmp_path, damage):
    folder = tmp_path / "sessions"
    with _server(run, run_dir, folder) as c:
        bad, good = _new(c, READ), _new(c, READ)
    spoil, words = DAMAGE[damage]
    spoil(folder, bad)
    with _server(run, run_dir, folder) as c:
        _error(c.get(f"/v1/sessions/{bad}"), 400, bad, words)
        _error(c.post(f"/v1/sessions/{bad}/score", json={"text": "x"}), 400, bad, words)
        _error(c.post(f"/v1/sessions/{bad}/completions", json={"prompt": "x"}), 400, bad)
        _error(c.get(f"/v1/sessions/{bad}/state"), 400, bad)
        assert _go_on(c, good) == _reference(run, run_dir, READ)
        assert c.get("/v1/health").json()["status"] == "ok"
        assert c.delete(f"/v1/sessions/{bad}").status_code == 200  # a damaged session can be deleted
        assert not list(folder.glob(f"{bad}.*"))


@pytest.fixture(scope="module")
def other_run_file(tmp_path_factory) -> bytes:
    """A session of another run (other weights), as one file."""
    other = train_char_run(tmp_path_factory.mktemp("other"), steps=3, overrides=("eval.mem_len=48",))
    with _server(load_run(other), other) as c:
        sid = _new(c, READ)
        return c.get(f"/v1/sessions/{sid}/state").content


def test_a_bad_upload_is_a_4xx_and_nothing_else_is_lost(run, run_dir, tmp_path, other_run_file):
    folder = tmp_path / "sessions"
    with _server(run, run_dir, folder) as c:
        good = _new(c, READ)
        data = c.get(f"/v1/sessions/{good}/state").content
        other_id = _document_of(other_run_file)["id"]
        _error(c.post("/v1/sessions", content=other_run_file), 400, other_id, "another run")
        _error(c.post("/v1/sessions", content=data[:-200]), 400, "truncated")
        _error(c.post("/v1/sessions", content=data[:5]), 400, "truncated")
        limit = run_identity(run).file_limit
        _error(c.post("/v1/sessions", content=data + b"\0" * limit), 413, "bytes")
        escaping = Session("../../escaped", created=1.0, last_used=0.0)
        _error(c.post("/v1/sessions", content=pack_session(escaping, run_identity(run))), 400, "escaped")
        for ident in ("a.b", ".hidden", "x" * 200, "%2E%2E"):
            _error(c.get(f"/v1/sessions/{ident}"), 400, "not a session id")
        for path in ("/v1/sessions/..%2F..%2Fescaped", "/v1/sessions/%2E%2E%2Fescaped/score"):
            assert 400 <= c.request("GET" if "score" not in path else "POST", path).status_code < 500
        assert not list(tmp_path.rglob("*escaped*"))
        assert sorted(p.name for p in folder.iterdir())[1:] == [f"{good}.json", f"{good}.lock"]
        assert _go_on(c, good) == _reference(run, run_dir, READ)


# -- bounds ---------------------------------------------------------------------------------------------------


def test_idle_sessions_expire_on_disk(run, run_dir, tmp_path):
    folder = tmp_path / "sessions"
    with _server(run, run_dir, folder, session_ttl=0.5) as c:
        sid = _new(c, READ)
        assert (folder / f"{sid}.json").exists()
        wait_for(lambda: c.get("/v1/health").json()["sessions_expired"] == 1, what="the session to expire")
        assert not list(folder.iterdir())
        _error(c.get(f"/v1/sessions/{sid}"), 404, sid)
        assert c.get("/v1/health").json()["sessions"] == 0


def test_the_oldest_idle_sessions_go_to_stay_under_the_bound(run, run_dir, tmp_path):
    folder = tmp_path / "sessions"
    bound = run_identity(run).file_limit  # the least the server takes: about six sessions of this run
    with _server(run, run_dir, folder, sessions_max_bytes=bound) as c:
        made = []
        while c.get("/v1/health").json()["sessions_evicted"] == 0:
            made.append(_new(c, READ))
            health = c.get("/v1/health").json()
            assert health["sessions_disk_bytes"] <= health["sessions_max_bytes"] == bound
            assert len(made) < 20
        assert len(made) >= 3
        _error(c.get(f"/v1/sessions/{made[0]}"), 404, made[0])  # the oldest went
        on_disk = sum(p.stat().st_size for p in folder.iterdir())
        assert on_disk == c.get("/v1/health").json()["sessions_disk_bytes"] <= bound
        assert _go_on(c, made[1]) == _reference(run, run_dir, READ)


def test_memory_holds_a_bounded_number_and_disk_the_rest(run, run_dir, tmp_path):
    with _server(run, run_dir, tmp_path / "sessions", max_sessions=2) as c:
        first = _new(c, READ)
        others = [_new(c, READ[:40]), _new(c, READ[40:])]
        health = c.get("/v1/health").json()
        assert (health["sessions"], health["sessions_in_memory"]) == (3, 2)
        assert _go_on(c, first) == _reference(run, run_dir, READ)  # read from disk again
        assert all(c.get(f"/v1/sessions/{o}").status_code == 200 for o in others)


def test_a_bound_below_one_session_is_refused(run, run_dir, tmp_path):
    with pytest.raises(ValueError, match="sessions_max_bytes: 1000 bytes cannot hold one session"):
        create_app(
            run, run_dir=run_dir, settings=ServeSettings(sessions_dir=tmp_path, sessions_max_bytes=1000)
        )
    with pytest.raises(ValueError, match="sessions_max_bytes"):
        ServeSettings(sessions_max_bytes=0)
    assert ServeSettings(sessions_dir=str(tmp_path)).sessions_dir == tmp_path


def test_without_a_folder_sessions_stay_in_memory(run, run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with _server(run, run_dir) as c:
        sid = _new(c, READ)
        health = c.get("/v1/health").json()
        assert (health["sessions"], health["sessions_disk_bytes"], health["sessions_max_bytes"]) == (
            1,
            None,
            None,
        )
        fork = c.post(f"/v1/sessions/{sid}/fork").json()["id"]
        assert _go_on(c, fork) == _go_on(c, sid)
    assert not list(tmp_path.iterdir())


def test_the_flags_of_txl_serve(run_dir, tmp_path, capsys):
    from txl.cli import main
    from txl.cli.serve import _byte_size

    sizes = [4096, 512 << 20, 4 << 30, 1024, 2 << 30]
    assert [_byte_size(t) for t in ("4096", "512M", "4G", "1k", "2GiB")] == sizes
    folder = tmp_path / "sessions"
    flags = ["serve", str(run_dir), "--port", "0", "--sessions-dir", str(folder)]
    assert main([*flags, "--sessions-max-bytes", "1K"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("txl: error: --sessions-max-bytes: 1024 bytes cannot hold one session")
    assert "sessions_max_bytes" not in error and "\n" not in error
    assert main([*flags, "--sessions-max-bytes", "0"]) == 2
    assert "--sessions-max-bytes must be a positive number of bytes" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["serve", str(run_dir), "--sessions-dir", str(tmp_path / "file" / "s")]) == 2
    assert "--sessions-dir" in capsys.readouterr().err


# -- a real server, killed -------------------------------------------------------------------------------------


@contextmanager
def _txl_serve(run_dir: Path, folder: Path) -> Iterator[tuple[httpx.Client, subprocess.Popen]]:
    """A ``txl serve RUN --sessions-dir FOLDER`` process on a free port: a client of it, and the process."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "txl", "serve", str(run_dir), "--port", "0", "--log-level", "warning"]
    proc = subprocess.Popen(
        [*command, "--sessions-dir", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        first = proc.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+)/$", first.strip())
        assert match, first
        with httpx.Client(base_url=match.group(1), timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/v1/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "txl serve did not answer"
                time.sleep(0.1)
            yield client, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_server_killed_and_started_again_continues_its_sessions_exactly(run_dir, tmp_path):
    """Real ``txl serve`` processes: one killed (SIGKILL) between two requests, started again, killed during a
    request, started again: the session is at its last completed request and goes on (greedy, seeded) exactly
    as on a server never stopped, and so does a fork of it; a session whose file was truncated meanwhile is a
    400, the others go on."""
    with _txl_serve(run_dir, tmp_path / "reference") as (client, _):
        ref = _new(client, READ)
        before = _complete(client, ref, "import ", GREEDY)
        expected = _go_on(client, ref)
    folder = tmp_path / "sessions"
    with _txl_serve(run_dir, folder) as (client, proc):
        sid, spare = _new(client, READ), _new(client, READ)
        assert _complete(client, sid, "import ", GREEDY) == before
        proc.send_signal(signal.SIGKILL)
    with _txl_serve(run_dir, folder) as (client, proc):
        body = {"prompt": "\nclass ", "max_tokens": 1000, "temperature": 0, "stream": True}
        with pytest.raises(httpx.TransportError):  # the server dies under the stream
            with client.stream("POST", f"/v1/sessions/{sid}/completions", json=body) as streamed:
                for line in streamed.iter_lines():
                    if line.startswith("data:") and '"text"' in line:
                        proc.send_signal(signal.SIGKILL)  # while it generates
                        proc.wait()
    kept = sorted(p.name for p in folder.glob(f"{sid}*"))
    assert len(kept) == 3 and kept[1:] == [f"{sid}.json", f"{sid}.lock"]  # one memory file, whole
    _truncate(_memory_file(folder, spare))
    with _txl_serve(run_dir, folder) as (client, proc):
        shown = client.get(f"/v1/sessions/{sid}").json()
        assert shown["tokens_read"] == len(READ + "import " + before[0])  # the killed request left no trace
        fork = client.post(f"/v1/sessions/{sid}/fork").json()["id"]
        assert _go_on(client, sid) == expected
        assert _go_on(client, fork) == expected
        _error(client.post(f"/v1/sessions/{spare}/score", json={"text": "x"}), 400, spare, "truncated")
        assert client.get("/v1/health").json()["status"] == "ok"
        assert proc.poll() is None
