"""Shared fixtures and helpers: seeds, a tiny float64 model config, where the real corpora live, a text
corpus found on every machine, and one trained tiny run for the tests that only read a run (a copy for
those that change it)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txl.threads import configure_threads

# The thread policy of txl's commands for this process and the txl processes it starts, before torch loads:
# on a busy machine, OpenMP threads that spin instead of sleeping made the suite several times slower.
configure_threads()

import torch  # noqa: E402

from txl import RunConfig, TransformerXLConfig  # noqa: E402
from txl.config import apply_overrides, load_config  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SHARED_DATA = Path(os.environ.get("TXL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def shared_data_dirs() -> list[Path]:
    """Where real corpora are looked for: the $TXL_DATA_DIR entries, then $TXL_SHARED_DATA or ../shared/data."""
    env = [Path(p) for p in os.environ.get("TXL_DATA_DIR", "").split(os.pathsep) if p]
    return [*env, SHARED_DATA]


def write_text_corpus(path: Path) -> Path:
    """Real text available on every machine: a few of Python's own source files, about 200 KB."""
    parts = [
        (STDLIB / name).read_text(encoding="utf-8") for name in ("argparse.py", "textwrap.py", "shlex.py")
    ]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_documents_corpus(folder: Path) -> Path:
    """A corpus of documents: ``train.jsonl``, ``valid.jsonl`` and ``test.jsonl`` in ``folder``, records of
    Python source (argparse, textwrap, shlex) cut into pieces of 30 to about 700 characters, so that
    documents begin inside segments and some span several (about 190 KB of training text)."""
    text = "\n".join(
        (STDLIB / name).read_text(encoding="utf-8") for name in ("argparse.py", "textwrap.py", "shlex.py")
    )
    pieces, start, k = [], 0, 0
    while start < len(text):
        size = 30 + (k * 197) % 680
        pieces.append(text[start : start + size])
        start, k = start + size, k + 1
    folder.mkdir(parents=True, exist_ok=True)
    n = len(pieces)
    for split, part in (
        ("train", pieces[: n * 8 // 10]),
        ("valid", pieces[n * 8 // 10 : n * 9 // 10]),
        ("test", pieces[n * 9 // 10 :]),
    ):
        lines = (json.dumps({"text": p, "id": i}) for i, p in enumerate(part))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def run_config(corpus: Path, *overrides: str) -> RunConfig:
    """The ``tiny`` preset on the text file ``corpus``, with ``section.field=value`` overrides."""
    return apply_overrides(load_config("tiny"), [f"data.corpus={json.dumps(str(corpus))}", *overrides])


def train_losses(run_dir: Path) -> dict[int, float]:
    """The train loss of each logged step of a run, from its metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def snapshot(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file under ``folder``, by relative path (to show that nothing changed)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for the test, as ``txl rl train`` runs (its thread policy): a run's floats then match
    the command's; the caller's count is given back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def compiled_steps_dir(tmp_path_factory) -> Iterator[Path]:
    """A folder of compiled decoding steps for the whole session (``TXL_COMPILED_DIR``): each set of sizes
    compiles once, and nothing is written to the user's cache folder."""
    from txl.model.compiled import COMPILED_DIR_VAR

    folder = tmp_path_factory.mktemp("compiled")
    patch = pytest.MonkeyPatch()
    patch.setenv(COMPILED_DIR_VAR, str(folder))
    yield folder
    patch.undo()


@pytest.fixture
def tiny_config() -> TransformerXLConfig:
    return TransformerXLConfig(
        vocab_size=37, n_layer=2, n_head=3, d_head=5, d_model=12, d_inner=20, mem_len=16
    )


@pytest.fixture(scope="session")
def shared_corpus() -> Callable[[str], Path]:
    """``shared_corpus(name)``: the data folder that holds real corpus ``name`` (as ``<dir>/<name>/``); the
    test is skipped when no folder has it."""

    def find(name: str) -> Path:
        for folder in shared_data_dirs():
            if (folder / name).is_dir():
                return folder
        looked = ", ".join(str(d / name) for d in shared_data_dirs())
        pytest.skip(
            f"real corpus '{name}' not available (looked in {looked}); set TXL_DATA_DIR or TXL_SHARED_DATA "
            "to the shared/data folder to run this test"
        )

    return find


@pytest.fixture
def text_corpus(tmp_path) -> Path:
    """:func:`write_text_corpus` in this test's folder."""
    return write_text_corpus(tmp_path / "corpus.txt")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One tiny run trained once for the session (10 steps, byte level, on :func:`write_text_corpus`), for the
    tests that only read a run; a test that changes it takes :func:`trained_run_copy`."""
    from txl.train.trainer import train

    folder = tmp_path_factory.mktemp("trained")
    torch.manual_seed(0)
    train(
        run_config(write_text_corpus(folder / "corpus.txt"), "train.steps=10"), folder / "run", progress=False
    )
    return folder / "run"


@pytest.fixture
def trained_run_copy(trained_run, tmp_path) -> Path:
    """A copy of :func:`trained_run` in this test's folder, free to change."""
    return Path(shutil.copytree(trained_run, tmp_path / "run"))


def generate_drawing_from(model, prompt, params, generator, *, memory=None, settings=None):
    """The rows of ``prompt`` (B, P) as requests of one engine (with ``settings``, a ``DecodeSettings``), all
    drawing from the caller's ``generator`` (in row order, at every step): the tokens (B, P + N), new tokens
    (B, N) and memory, as ``generate`` returns them, so that a continuation can draw on from where the
    generator stopped."""
    from types import SimpleNamespace

    from txl.inference import Engine
    from txl.model import Memory

    engine = Engine(model) if settings is None else Engine(model, settings)
    ids = [
        engine.add(row, params, memory=None if memory is None else memory.select([r]), generator=generator)
        for r, row in enumerate(prompt)
    ]
    new: dict[int, list[int]] = {i: [] for i in ids}
    memories: dict[int, Memory] = {}
    while engine.unfinished:
        for event in engine.step():
            new[event.request].append(event.token)
            if event.finish is not None:
                memories[event.request] = engine.memory(event.request)
    new_tokens = torch.tensor([new[i] for i in ids])
    return SimpleNamespace(
        tokens=torch.cat([prompt, new_tokens], dim=1),
        new_tokens=new_tokens,
        memory=Memory.cat_rows([memories[i] for i in ids]),
    )
