"""``txl demo`` wiring: both models train the same fixed number of steps, the comparison table and a sample are
printed, and the same steps print the same table (shrunk here to a few steps of a small model on a small real
text; the real demo trains for minutes on the Python standard library)."""

from __future__ import annotations

import dataclasses
import json
import sysconfig
from pathlib import Path

import pytest

import txl.demo as demo
from txl.data import load_corpus


@pytest.fixture
def small_demo(tmp_path, monkeypatch):
    """Make the demo's model tiny and its corpus one stdlib module, so that a demo takes seconds."""
    corpus = tmp_path / "corpus.txt"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus.write_text((stdlib / "textwrap.py").read_text(encoding="utf-8") * 2, encoding="utf-8")
    real_config = demo.demo_config

    def small_config(steps):
        config = real_config(steps)
        return dataclasses.replace(
            config,
            model=dataclasses.replace(config.model, n_layer=1, d_model=16, d_head=8, n_head=2, d_inner=32),
            data=dataclasses.replace(config.data, corpus=str(corpus)),
            train=dataclasses.replace(config.train, batch_size=4, tgt_len=16),
        )

    monkeypatch.setattr(demo, "demo_config", small_config)


def _table(out: str) -> list[str]:
    """The lines of the comparison: header, one row per model, and the difference."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("validation and test bits per byte"))
    end = next(i for i, line in enumerate(lines) if line.startswith("Transformer-XL vs vanilla"))
    return lines[start : end + 1]


def test_demo_trains_both_models_and_prints_the_comparison(tmp_path, small_demo, capsys):
    report = demo.run_demo(tmp_path / "demo", steps=8, progress=False)
    out = capsys.readouterr().out
    assert "transformer-xl" in out and "vanilla" in out and "val bpb" in out
    assert "training transformer-xl for 8 steps" in out and "training vanilla for 8 steps" in out
    assert out.rstrip().splitlines()[-1]  # the sample
    for name in ("transformer-xl", "vanilla"):
        assert report["results"][name]["steps"] == 8 and report["results"][name]["status"] == "completed"
    assert report["sample"].startswith("def ") and len(report["sample"]) > 4
    saved = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert (
        saved["results"]["vanilla"]["val_bpb"] == saved["results"]["vanilla"]["val_bits_per_token"] > 0
    )  # bytes
    assert "val_bpc" not in saved["results"]["vanilla"]


def test_the_same_steps_print_the_same_table(tmp_path, small_demo, capsys):
    demo.run_demo(tmp_path / "first", steps=6, progress=False)
    first = capsys.readouterr().out
    demo.run_demo(tmp_path / "second", steps=6, progress=False)
    second = capsys.readouterr().out
    assert _table(first) == _table(second) and len(_table(first)) == 5
    assert [line for line in _table(first) if line.startswith(("transformer-xl", "vanilla"))][0].split()[
        2
    ] == "6"
    demo.run_demo(tmp_path / "first", steps=5, progress=False)  # a second demo in a folder replaces the first
    assert json.loads((tmp_path / "first" / "transformer-xl" / "summary.json").read_text())["steps"] == 5


def test_minutes_times_the_machine_and_says_so(tmp_path, small_demo, monkeypatch, capsys):
    monkeypatch.setattr(demo, "_steps_for", lambda config, minutes: 4)
    report = demo.run_demo(tmp_path / "demo", minutes=0.1, progress=False)
    out = capsys.readouterr().out
    assert "timing a few steps" in out and "this machine's speed" in out and "--steps" in out
    assert report["steps"] == 4 == report["results"]["vanilla"]["steps"]
    with pytest.raises(ValueError, match="steps or minutes"):
        demo.run_demo(tmp_path / "demo", steps=4, minutes=0.1, progress=False)


def test_the_default_is_a_fixed_number_of_steps():
    assert isinstance(demo.DEFAULT_STEPS, int) and 2000 <= demo.DEFAULT_STEPS <= 3000
    assert demo.choose_steps(None, None) == demo.DEFAULT_STEPS and demo.choose_steps(7, None) == 7


def test_the_embedded_corpus_exists_here():
    corpus = load_corpus("python-stdlib")
    assert all(corpus.has(s) for s in ("train", "valid", "test"))
    assert len(corpus.splits["valid"]) > 10_000 and corpus.level == "byte"
