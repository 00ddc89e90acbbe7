"""Bad input at the edges of the machine: output paths that cannot be written (under a file, read-only, no
space, a folder for a file), sizes that cannot fit, a run folder given to convert, and operating-system or
memory errors deep inside: one ``txl: error:`` line each, exit status 2, nothing left behind."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import txl.cli
import txl.limits
from txl.config import Span, TransformerXLConfig
from txl.errors import OutputPathError
from txl.files import check_output
from txl.model import KVCache

GIB = 1024**3


def _one_line(capsys, argv: list[str], *fragments: str) -> str:
    code = txl.cli.main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and lines[0].startswith("txl: error: "), captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _mount_tmpfs(where: Path, options: str) -> Path:
    """A tmpfs mounted at ``where`` (a read-only or a tiny one); skips the test where mounting is not allowed."""
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a read-only or full file system cannot be arranged")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root in a mount namespace): {done.stderr.strip()}")
    return where


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder on a read-only file system (a tmpfs mounted ``ro``: chmod does not stop root)."""
    folder = _mount_tmpfs(tmp_path / "ro", "ro,size=64k")
    yield folder
    subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def full_dir(tmp_path):
    """A folder on a file system with no room left (a tmpfs of two inodes, one of them taken)."""
    folder = _mount_tmpfs(tmp_path / "full", "size=64k,nr_inodes=2")
    (folder / "taken").mkdir()
    yield folder
    subprocess.run(["umount", str(folder)], check=False)


@pytest.fixture
def little_memory(monkeypatch):
    """1 GiB available, whatever this machine has: what is refused does not follow its load."""
    monkeypatch.setattr(txl.limits, "available_bytes", lambda device="cpu": GIB)


# ---------------------------------------------------------------------------------------------------------
# The table, row by row
# ---------------------------------------------------------------------------------------------------------

ROWS = {
    "train under a file": (
        ["train", "--config", "tiny", "--out", "FILE/sub", "--quiet"],
        ["--out", "FILE/sub"],
    ),
    "train on a read-only fs": (
        ["train", "--config", "tiny", "--out", "RO/run", "--quiet"],
        ["--out", "RO/run"],
    ),
    "demo on a read-only fs": (["demo", "--steps", "2", "--out", "RO/demo", "--quiet"], ["--out", "RO/demo"]),
    "export on a read-only fs": (
        ["export", "RUN", "--out", "RO/m.onnx", "--no-check"],
        ["--out", "RO/m.onnx"],
    ),
    "export to a folder": (["export", "RUN", "--out", "DIR", "--no-check"], ["--out", "DIR", "is a folder"]),
    "convert a run folder": (
        ["convert", "RUN", "OUT"],
        ["RUN", "txl run folder", "--from hf", "--from original"],
    ),
    # the cache: 2 layers x 125,000,000 slots x (32 + 2 x 2 x 16) x 4 bytes = 89.4 GiB
    "generate a memory too long": (
        ["generate", "RUN", "--prompt", "ROMEO:", "--mem-len", "100000000", "--max-new-tokens", "5"],
        ["--mem-len 100000000", "89.4 GiB", "1 GiB is available", "lower --mem-len"],
    ),
}
REASONS = {"FILE/": "is under FILE, which is a file", "RO/": "RO is on a read-only file system"}


@pytest.mark.parametrize("row", list(ROWS))
def test_each_row_of_the_table_is_one_line(row, request, tmp_path, trained_run_copy, capsys, little_memory):
    argv, fragments = ROWS[row]
    places = {"FILE": tmp_path / "file", "DIR": tmp_path / "folder", "RUN": trained_run_copy}
    places["FILE"].write_text("a file, not a folder\n")
    places["DIR"].mkdir()
    places["OUT"] = tmp_path / "converted"
    if any(a.startswith("RO/") for a in argv):
        places["RO"] = request.getfixturevalue("read_only_dir")

    def fill(text: str) -> str:
        return re.sub(r"\b(FILE|DIR|RUN|OUT|RO)\b", lambda m: str(places[m[1]]), text)

    reasons = [r for key, r in REASONS.items() if any(a.startswith(key) for a in argv)]
    before = _listing(tmp_path)
    line = _one_line(capsys, [fill(a) for a in argv], *[fill(f) for f in fragments + reasons])
    assert "Traceback" not in line
    assert _listing(tmp_path) == before  # nothing half-written, no folder made, the run untouched


# ---------------------------------------------------------------------------------------------------------
# The one output check: every reason, and nothing left behind
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.EROFS, "is on a read-only file system"),
        (errno.EACCES, "is not writable (permission denied)"),
        (errno.EPERM, "is not writable (operation not permitted)"),
        (errno.ENOSPC, "has no space left on its device"),
        (errno.EDQUOT, "has no space left (disk quota exceeded)"),
        (errno.EIO, "cannot be written (Input/output error)"),
    ],
)
@pytest.mark.parametrize("exists", [True, False])
def test_output_check_names_flag_path_and_reason(tmp_path, monkeypatch, code, words, exists):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    out = tmp_path / "run"
    if exists:
        out.mkdir()
    with pytest.raises(OutputPathError) as info:
        check_output(out, flag="--out")
    where = "" if exists else f"{tmp_path} "
    assert str(info.value) == f"--out {out}: {where}{words}"


def test_output_check_on_real_file_systems(tmp_path, read_only_dir, full_dir):
    for folder, reason in ((read_only_dir, "read-only file system"), (full_dir, "no space left")):
        for out, kind in ((folder / "a" / "b", "folder"), (folder, "folder"), (folder / "m.onnx", "file")):
            with pytest.raises(OutputPathError, match=reason):
                check_output(out, flag="--out", kind=kind)
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputPathError, match="exists and is not a folder"):
        check_output(tmp_path / "f", flag="--out")
    with pytest.raises(OutputPathError, match=f"is under {tmp_path / 'f'}, which is a file"):
        check_output(tmp_path / "f" / "g" / "m.onnx", flag="--out", kind="file")
    before = _listing(tmp_path)
    assert check_output(tmp_path / "new" / "run", flag="--out") == tmp_path / "new" / "run"
    assert check_output(tmp_path, flag="--out") == tmp_path
    assert check_output(tmp_path / "m.onnx", flag="--out", kind="file") == tmp_path / "m.onnx"
    assert _listing(tmp_path) == before  # the probes are gone


def test_every_writing_command_checks_its_output(tmp_path, trained_run, full_dir, capsys):
    """The same check before any work, in each command that writes (no space left: the tmpfs is full)."""
    run = str(trained_run)
    out = str(full_dir / "x")
    commands = [
        ["train", "--config", "tiny", "--out", out, "--quiet"],
        ["demo", "--steps", "1", "--out", out, "--quiet"],
        ["compare", "--config", "tiny", "--out", out, "--quiet"],
        ["analyze", "memory", run, "--out", out, "--quiet"],
        ["analyze", "speed", "--out", out, "--quiet"],
        ["analyze", "recl", run, "--out", out, "--quiet"],
        ["analyze", "recall", "--out", out, "--quiet"],
        ["analyze", "attention", run, "--out", out, "--quiet"],
        ["export", run, "--out", out + ".onnx", "--no-check"],
        ["convert", run, out],
        ["data", "download", "wikitext-2", "--dest", out, "--quiet"],
    ]
    for argv in commands:
        flag = "DST" if argv[0] == "convert" else "--dest" if argv[0] == "data" else "--out"
        _one_line(capsys, argv, f"{flag} {out}", "no space left")
    assert _listing(full_dir) == ["taken"]


# ---------------------------------------------------------------------------------------------------------
# Sizes that cannot fit
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mem_len", "batch"), [(1, 1), (7, 3), (64, 2), (1000, 1)])
def test_cache_bytes_is_what_the_cache_allocates(mem_len, batch):
    config = TransformerXLConfig(
        vocab_size=50, n_layer=3, n_head=2, d_head=5, d_model=12, d_inner=20, mem_len=4
    )
    cache = KVCache(config, batch_size=batch, span=Span(mem_len=mem_len), dtype=torch.float64)
    allocated = cache.hidden.numel() * 8 + cache.kv.numel() * 8
    assert txl.limits.cache_bytes(config, batch=batch, mem_len=mem_len, dtype_bytes=8) == allocated


def test_segment_bytes_counts_memory_and_attention():
    config = TransformerXLConfig(vocab_size=50, n_layer=3, n_head=2, d_head=5, d_model=12, d_inner=20)
    # memory 3 x 4 x 10 x 12; one layer's probabilities 4 x 2 x 6 x 16 (all three when training); float32
    memory, scores = 3 * 4 * 10 * 12, 4 * 2 * 6 * 16
    assert txl.limits.segment_bytes(config, batch=4, tgt_len=6, mem_len=10) == 4 * (memory + scores)
    assert txl.limits.segment_bytes(config, batch=4, tgt_len=6, mem_len=10, training=True) == 4 * (
        memory + 3 * scores
    )


def test_available_bytes_reads_meminfo():
    free = txl.limits.available_bytes("cpu")
    with open("/proc/meminfo", encoding="ascii") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
    assert free is not None and abs(free - kib * 1024) < 2 * GIB  # read a moment apart
    assert txl.limits.available_bytes("meta") is None


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (
            # txl.evaluation.check_eval_fits, K = 10^8 + 64 keys, float32: the states, keys and values of 2 layers,
            # 2 x 32 rows x K x (32 + 2 x 2 x 16), and one layer's scores and probabilities, 2 x 32 x 2 heads x
            # 64 x K, + the log-probabilities 32 x 64 x V: 5.22 TiB (more than the cache's 2.79 TiB)
            ["eval", "RUN", "--mem-len", "100000000"],
            ["--batch-size 32 --tgt-len 64 --mem-len 100000000", "5.22 TiB", "lower --batch-size"],
        ),
        (  # 10^9 tokens x 8 bytes
            ["generate", "RUN", "--max-new-tokens", "1000000000"],
            ["--max-new-tokens 1000000000", "7.45 GiB", "lower --max-new-tokens"],
        ),
        # Sizes that no machine here could allocate at all: a check that let them through fails at once
        (  # 2 layers x 64 rows x 2 heads x 10^6 x (10^6 + 16) x 4 bytes, + the memory 2 x 64 x 16 x 32 x 4
            [
                "train",
                "--config",
                "tiny",
                "--out",
                "OUT",
                "--set",
                "train.batch_size=64",
                "--set",
                "train.tgt_len=1000000",
            ],
            ["train.batch_size 64, train.tgt_len 1000000, model.mem_len 16", "931 TiB", "train.accum_steps"],
        ),
        # the memory 2 layers x 2 rows x 10^9 x 32, + one layer's attention 2 x 2 heads x 8 x (10^9 + 8), x 4 bytes
        (
            ["export", "RUN", "--out", "OUT.onnx", "--tgt-len", "8", "--mem-len", "1000000000"],
            ["--tgt-len 8 --mem-len 1000000000", "596 GiB", "lower --tgt-len or --mem-len"],
        ),
    ],
)
def test_sizes_that_cannot_fit_are_refused_before_allocating(
    argv, fragments, tmp_path, trained_run, capsys, little_memory
):
    argv = [str(trained_run) if a == "RUN" else a.replace("OUT", str(tmp_path / "out")) for a in argv]
    _one_line(capsys, argv, *fragments, "1 GiB is available")
    assert _listing(tmp_path) == []


def test_export_sizes_the_memory_it_exports(trained_run_copy, tmp_path, capsys, little_memory):
    """A run whose [eval] section asks a memory far longer than its model's: the export uses the [eval] one
    (as txl eval does), so that is the one refused (2 layers x 2 rows x 10^9 x 32, + the attention, x 4
    bytes); the model's own memory (16) would fit."""
    import json

    config = json.loads((trained_run_copy / "config.json").read_text())
    config["eval"].update(mem_len=1_000_000_000, tgt_len=8)
    (trained_run_copy / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out" / "m.onnx"
    _one_line(
        capsys,
        ["export", str(trained_run_copy), "--out", str(out)],
        "--tgt-len 8 --mem-len 1000000000",
        "596 GiB",
    )
    assert not out.parent.exists()


def test_train_sizes_the_config_it_trains_with(tmp_path, little_memory):
    """The library's train() refuses, before writing anything, a segment whose training buffers cannot fit
    (2 layers x 64 rows x 2 heads x 10^6 x (10^6 + 16) x 4 bytes: 931 TiB), naming the fields to lower."""
    from conftest import run_config, write_text_corpus
    from txl.errors import SizeError
    from txl.train.trainer import train

    config = run_config(
        write_text_corpus(tmp_path / "corpus.txt"), "train.batch_size=64", "train.tgt_len=1000000"
    )
    with pytest.raises(
        SizeError, match=r"train.batch_size 64, train.tgt_len 1000000, model.mem_len 16: .*931 TiB"
    ):
        train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_sizes_that_fit_go_on(trained_run, capsys, little_memory):
    assert txl.cli.main(["generate", str(trained_run), "--mem-len", "1000", "--max-new-tokens", "3"]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------------------
# convert: a source it cannot read says what it expected
# ---------------------------------------------------------------------------------------------------------


def test_convert_unreadable_sources_say_what_is_expected(tmp_path, trained_run, capsys):
    # a txl config.json and vocabulary, no checkpoints: read as a Hugging Face folder
    half = tmp_path / "half"
    half.mkdir()
    for name in ("config.json", "vocab.json"):
        shutil.copy(trained_run / name, half / name)
    line = _one_line(
        capsys, ["convert", str(half), str(tmp_path / "a")], str(half), "--from hf", "--from original"
    )
    assert "cannot read this folder as --from hf" in line
    garbage = tmp_path / "model.pt"
    garbage.write_bytes(b"\x00not a state dict")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    _one_line(capsys, ["convert", str(garbage), str(tmp_path / "b"), "--mem-len", "8"], str(garbage))
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line(
        capsys, ["convert", str(empty), str(tmp_path / "c")], str(empty), "--from hf", "--from original"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "half", "model.pt", "vocab.txt"]


def test_a_failed_export_leaves_no_file(tmp_path, trained_run, monkeypatch):
    from txl.interop.onnx import export_model
    from txl.runs import load_run

    def half_written(module, args, path, **kwargs):
        Path(path).write_bytes(b"half an onnx file")
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(torch.onnx, "export", half_written)
    old = tmp_path / "m.onnx"
    old.write_bytes(b"the previous export")
    with pytest.raises(OSError):
        export_model(load_run(trained_run).model, old, tgt_len=4, mem_len=4)
    assert _listing(tmp_path) == ["m.onnx"] and old.read_bytes() == b"the previous export"


# ---------------------------------------------------------------------------------------------------------
# Every command's top level: an unexpected OSError or MemoryError is one line; --debug adds the traceback
# ---------------------------------------------------------------------------------------------------------

COMMANDS = {
    "_cmd_train": ["train", "--config", "tiny", "--out", "OUT"],
    "_cmd_eval": ["eval", "RUN"],
    "_cmd_generate": ["generate", "RUN"],
    "_cmd_serve": ["serve", "RUN"],
    "_cmd_demo": ["demo", "--out", "OUT"],
    "_cmd_data_list": ["data", "list"],
    "_cmd_data_download": ["data", "download", "wikitext-103", "--dest", "OUT"],
    "_cmd_convert": ["convert", "RUN", "OUT"],
    "_cmd_export": ["export", "RUN", "--out", "OUT.onnx"],
    "_cmd_compare": ["compare", "--config", "tiny", "--out", "OUT"],
    "_cmd_analyze_memory": ["analyze", "memory", "RUN", "--out", "OUT"],
    "_cmd_analyze_speed": ["analyze", "speed", "--out", "OUT"],
    "_cmd_analyze_recl": ["analyze", "recl", "RUN", "--out", "OUT"],
    "_cmd_analyze_recall": ["analyze", "recall", "--out", "OUT"],
    "_cmd_analyze_attention": ["analyze", "attention", "RUN", "--out", "OUT"],
    "_cmd_analyze_documents": ["analyze", "documents", "RUN", "--out", "OUT"],
    "_cmd_harness": ["harness", "RUN", "--tasks", "txl_wikitext_local"],
    "_cmd_rl_train": ["rl", "train", "--out", "OUT"],
    "_cmd_rl_eval": ["rl", "eval", "RUN"],
    "_cmd_rl_plot": ["rl", "plot", "RUN", "--out", "OUT.png"],
}
FAILURES = {
    "no space": (
        lambda: OSError(errno.ENOSPC, "No space left on device", "/x/metrics.jsonl"),
        "/x/metrics.jsonl: no space left on device",
    ),
    "read-only": (
        lambda: OSError(errno.EROFS, "Read-only file system", "/x/a", None, "/x/b"),
        "/x/a -> /x/b: read-only file system",
    ),
    "MemoryError": (lambda: MemoryError(), "out of memory (MemoryError); lower"),
    "allocator": (
        lambda: RuntimeError(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 256000000000 bytes."
        ),
        "out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate 256000000000 bytes.); lower",
    ),
}


def _leaf_functions() -> set[str]:
    """The name of every command function the parser can call."""
    import argparse

    names, todo = set(), [txl.cli.build_parser()]
    while todo:
        parser = todo.pop()
        if "func" in parser._defaults:
            names.add(parser._defaults["func"].__name__)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return names


def _replace_handler(monkeypatch, name, handler):
    """Make the command whose handler is called ``name`` call ``handler`` instead."""
    from dataclasses import replace

    import txl.cli.commands

    commands = [
        replace(c, handler=handler) if c.handler.__name__ == name else c for c in txl.cli.commands.COMMANDS
    ]
    monkeypatch.setattr(txl.cli.commands, "COMMANDS", tuple(commands))


def test_the_list_of_commands_is_complete():
    assert _leaf_functions() == set(COMMANDS)


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("func", list(COMMANDS))
def test_every_top_level_turns_os_and_memory_errors_into_one_line(
    func, failure, tmp_path, monkeypatch, capsys
):
    make, expected = FAILURES[failure]

    def fails(args):
        raise make()

    _replace_handler(monkeypatch, func, fails)
    monkeypatch.delenv("TXL_DEBUG", raising=False)
    argv = [tmp_path.name if a == "RUN" else a.replace("OUT", str(tmp_path / "out")) for a in COMMANDS[func]]
    line = _one_line(capsys, argv)
    assert expected in line
    for debug_argv, env in (([*argv], "1"), (["--debug", *argv], None)):
        if env:
            monkeypatch.setenv("TXL_DEBUG", env)
        else:
            monkeypatch.delenv("TXL_DEBUG")
        assert txl.cli.main(debug_argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[0] == "Traceback (most recent call last):" and err[-1] == line


def test_a_bug_is_still_a_traceback(monkeypatch):
    def bug(args):
        raise RuntimeError("shape mismatch")

    _replace_handler(monkeypatch, "_cmd_data_list", bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        txl.cli.main(["data", "list"])


def test_debug_flag_states_its_default(capsys):
    with pytest.raises(SystemExit):
        txl.cli.main(["--help"])
    assert "(default: off; TXL_DEBUG=1 does the same)" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------------------------------------------------
# The library names fields, the command line its flags
# ---------------------------------------------------------------------------------------------------------


def test_a_python_caller_and_a_cli_user_each_get_the_name_they_typed(trained_run, capsys, little_memory):
    """The same refusal (10^9 tokens x 8 bytes of one sample): ``max_new_tokens`` to a Python caller of
    generate_from_run, ``--max-new-tokens`` to a user of ``txl generate``."""
    from txl.errors import SizeError
    from txl.inference import SamplingParams
    from txl.inference.text import generate_from_run
    from txl.runs import load_run

    with pytest.raises(SizeError) as caught:
        generate_from_run(load_run(trained_run), "ROMEO:", SamplingParams(max_new_tokens=10**9))
    message = str(caught.value)
    assert message.startswith("max_new_tokens 1000000000: ") and "lower max_new_tokens" in message, message
    assert "--" not in message and caught.value.fields == ("max_new_tokens",)
    line = _one_line(capsys, ["generate", str(trained_run), "--max-new-tokens", "1000000000"])
    assert line == f"txl: error: {txl.cli.with_flags(message, ('max_new_tokens',))}"
    assert "--max-new-tokens 1000000000: " in line and "lower --max-new-tokens" in line
    assert "max_new_tokens" not in line


def test_with_flags_rewrites_the_fields_named_and_nothing_else():
    from txl.cli import FIELD_FLAGS, with_flags

    text = "mem_len 8 (eval.mem_len 4, the model's mem_len 2, runs/mem_len/x): lower mem_len."
    assert with_flags(text, ("mem_len",)) == (
        "--mem-len 8 (eval.mem_len 4, the model's --mem-len 2, runs/mem_len/x): lower --mem-len."
    )
    assert with_flags(text, ()) == text  # only the fields the error says it names
    assert with_flags("resume with train.steps=N", ("train.steps",)) == "resume with --set train.steps=N"
    assert with_flags("pass check=False", ("check=False",)) == "pass --no-check"
    assert with_flags("prompts 'x': no tokens", ("prompts",)) == "--prompt 'x': no tokens"
    assert all(flag.startswith("--") for flag in FIELD_FLAGS.values())


def test_every_flag_of_the_table_is_a_flag_of_some_command():
    """The table names no flag that no command has (a flag renamed in one place only)."""
    import argparse

    from txl.cli import FIELD_FLAGS, build_parser

    flags: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    assert {flag.split()[0] for flag in FIELD_FLAGS.values()} <= flags


def test_a_length_given_is_named_as_given(trained_run, tmp_path, capsys):
    """A memory length given to eval_span is refused naming it (``mem_len`` to a Python caller, not the
    ``eval.mem_len`` of a config file), and ``--mem-len`` on the command line of an analysis."""
    from txl.config import ConfigError, eval_span
    from txl.runs import load_run_config

    with pytest.raises(ConfigError, match=r"^mem_len: must be an integer >= 0, got -1$"):
        eval_span(load_run_config(trained_run), mem_len=-1)
    argv = ["analyze", "attention", str(trained_run), "--mem-len", "-1", "--out", str(tmp_path / "out")]
    assert _one_line(capsys, argv) == "txl: error: --mem-len: must be an integer >= 0, got -1"
