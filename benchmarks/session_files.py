"""The size of one session of ``txl serve --sessions-dir`` and the time to save and restore it, for the model shapes
of the default config and the presets (``wt103-base`` among them): a session whose memory is full (the
evaluation memory length of the shape), written to a folder as the server writes it after a request (its memory
file, then its document, each fsynced, then the folder) and read back as a restarted server reads it (checked:
format, run, checksum, values); and as one file (``GET /v1/sessions/{id}/state``, ``POST /v1/sessions``). The
shapes alternate within each round; medians of the rounds. Prints one JSON object.

    PYTHONPATH=src python3 benchmarks/session_files.py --rounds 20 [--folder DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from txl.config import RunConfig, eval_lengths, load_config
from txl.model import Memory
from txl.serve.session_files import RunIdentity, SessionFiles, pack_session, unpack_session
from txl.serve.sessions import Session

SHAPES = ("default", "tiny", "shakespeare-char", "enwik8-base", "wt103-base")


def identity_of(config: RunConfig) -> RunIdentity:
    lengths = eval_lengths(config)
    return RunIdentity(
        weights="0" * 64,
        vocab="0" * 64,
        vocab_size=config.model.vocab_size,
        n_layer=config.model.n_layer,
        d_model=config.model.d_model,
        dtype="float32",
        tgt_len=lengths.tgt_len,
        mem_len=lengths.span.mem_len,
        clamp_len=lengths.span.clamp_len,
        same_length=lengths.span.same_length,
    )


def full_session(identity: RunIdentity, ident: str) -> Session:
    """A session that has read more than its memory holds: every layer's memory full."""
    generator = torch.Generator().manual_seed(0)
    states = tuple(
        torch.randn(1, identity.mem_len, identity.d_model, generator=generator)
        for _ in range(identity.n_layer)
    )
    session = Session(ident, created=time.time(), last_used=0.0, pending=1, recent=[1] * 8, tokens_read=10**6)
    session.memory = Memory(states)
    return session


def one_round(identity: RunIdentity, files: SessionFiles, session: Session) -> dict[str, float]:
    """Milliseconds to save the session, restore it, pack it as one file and unpack that."""
    clock = time.perf_counter
    start = clock()
    session.revision, _ = files.save(session)
    saved = clock()
    files.load(session.id, files.read_document(session.id))
    restored = clock()
    data = pack_session(session, identity)
    packed = clock()
    unpack_session(data, identity)
    unpacked = clock()
    return {
        "save": 1000 * (saved - start),
        "restore": 1000 * (restored - saved),
        "pack": 1000 * (packed - restored),
        "unpack": 1000 * (unpacked - packed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--folder", type=Path, default=None, help="where to write (default: a temporary folder)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    configs = {name: RunConfig() if name == "default" else load_config(name) for name in SHAPES}
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        stores = {}
        for name, config in configs.items():
            identity = identity_of(config)
            files = SessionFiles(Path(tmp) / name, identity, max_bytes=1 << 40, ttl=3600.0)
            stores[name] = (identity, files, full_session(identity, f"sess-{name}"))
        times: dict[str, list[dict[str, float]]] = {name: [] for name in SHAPES}
        for _ in range(args.rounds):
            for name in SHAPES:  # the shapes alternate
                times[name].append(one_round(*stores[name]))
        shapes = {}
        for name, (identity, _, session) in stores.items():
            folder = Path(tmp) / name
            on_disk = sum(p.stat().st_size for p in folder.iterdir())
            shapes[name] = {
                "n_layer": identity.n_layer,
                "d_model": identity.d_model,
                "eval_mem_len": identity.mem_len,
                "memory_bytes": identity.memory_bytes - 8,
                "files_bytes": on_disk,
                "one_file_bytes": len(pack_session(session, identity)),
                **{f"{k}_ms": round(statistics.median(t[k] for t in times[name]), 3) for k in times[name][0]},
            }
    print(
        json.dumps(
            {
                "benchmark": "session_files",
                "rounds": args.rounds,
                "torch_threads": torch.get_num_threads(),
                "load_average": os.getloadavg(),
                "shapes": shapes,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
