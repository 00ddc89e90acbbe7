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
from txl.analysis.report import SIGN_CONVENTION
from txl.data import load_corpus
from txl.errors import TxlError


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
    end = next(i for i, line in enumerate(lines) if line.startswith("Transformer-XL - vanilla"))
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
    where = tmp_path / "demo"
    assert (
        f"runs: {where / 'transformer-xl'} and {where / 'vanilla'}; figures and sample: {where / 'demo.json'}"
        in out
    ), out
    assert f"txl generate {where / 'transformer-xl'} --prompt" in out  # what to do with them


def test_the_same_steps_print_the_same_table(tmp_path, small_demo, capsys):
    demo.run_demo(tmp_path / "first", steps=6, progress=False)
    first = capsys.readouterr().out
    demo.run_demo(tmp_path / "second", steps=6, progress=False)
    second = capsys.readouterr().out
    assert _table(first) == _table(second) and len(_table(first)) == 6
    assert [line for line in _table(first) if line.startswith(("transformer-xl", "vanilla"))][0].split()[
        2
    ] == "6"
    demo.run_demo(tmp_path / "first", steps=5, progress=False)  # a second demo in a folder replaces the first
    assert json.loads((tmp_path / "first" / "transformer-xl" / "summary.json").read_text())["steps"] == 5


FAKE = {"transformer-xl": 0.5, "vanilla": 0.25}  # seconds per training step, as if measured here


def _fake_costs(config, data):
    """What measure_costs would say on a slow machine: training steps of 0.5 s and 0.25 s, evaluations of
    40 s and 20 s (so that the plans below are checked against figures, not this machine's load)."""
    return demo.DemoCosts(train_s_per_step=dict(FAKE), eval_s={"transformer-xl": 40.0, "vanilla": 20.0})


def test_the_estimate_includes_the_evaluation_measured_here(tmp_path, small_demo, monkeypatch, capsys):
    monkeypatch.setattr(demo, "measure_costs", _fake_costs)
    demo.run_demo(tmp_path / "demo", steps=6, progress=False)
    out = capsys.readouterr().out
    estimate = next(line for line in out.splitlines() if line.startswith("estimate:"))
    # 6 steps x (0.5 + 0.25) s x 1.15 of loop overhead = 5 s of training, 60 s of evaluation, measured here
    assert "about 1.1 min" in estimate and "evaluating both models" in estimate and "1.0 min" in estimate
    assert "measured on this machine" in estimate and "quiet" not in out
    assert "took" in out.splitlines()[-1] or any(line.startswith("took ") for line in out.splitlines())


def test_minutes_bounds_the_whole_command(tmp_path, small_demo, monkeypatch, capsys):
    costs = _fake_costs(None, None)
    # 2 min: 120 s less 10 s already spent less 60 s of evaluation leaves 50 s: steps of 0.75 s x 1.15
    assert demo.plan_minutes(2.0, costs, spent=10.0) == (
        57,
        {"transformer-xl": 50 * 2 / 3, "vanilla": 50 / 3},
    )
    with pytest.raises(TxlError, match=r"--minutes 1: evaluating both models .* 1.0 min .* --minutes 1.3"):
        demo.plan_minutes(1.0, costs, spent=1.0)
    monkeypatch.setattr(demo, "measure_costs", _fake_costs)
    monkeypatch.setattr(
        demo, "plan_minutes", lambda minutes, costs, spent: (4, {"transformer-xl": 0.3, "vanilla": 0.2})
    )
    report = demo.run_demo(tmp_path / "demo", minutes=3, progress=False)
    out = capsys.readouterr().out
    assert "this machine's speed" in out and "--steps" in out and "whole command" in out
    assert report["steps"] == 4
    for name, seconds in (("transformer-xl", 0.3), ("vanilla", 0.2)):  # training stops at its share
        saved = json.loads((tmp_path / "demo" / name / "config.json").read_text())
        assert saved["train"]["time_limit"] == pytest.approx(seconds / 60)
    with pytest.raises(ValueError, match="steps or minutes"):
        demo.run_demo(tmp_path / "demo", steps=4, minutes=0.1, progress=False)


def test_both_tables_state_one_sign_convention(capsys):
    results = {
        "transformer-xl": {"params": 10, "steps": 5, "val_bpb": 2.0, "test_bpb": 2.1, "elapsed_s": 1.0},
        "vanilla": {"params": 9, "steps": 5, "val_bpb": 2.263, "test_bpb": 2.3, "elapsed_s": 1.0},
    }
    table = demo.comparison_table(results)
    assert SIGN_CONVENTION in table and "-0.263" in table and "+0.263" not in table
    from txl.analysis.compare import CompareResult

    models = {
        name: {"val_loss": loss, "val_ppl": 1.0, "val_bpb": loss, "train_tokens_per_s": 1.0}
        for name, loss in (("xl", 2.0135), ("vanilla", 2.0), ("vanilla_sliding", 2.0))
    }
    relative = {b: {"val_loss": 0.00675} for b in ("vanilla", "vanilla_sliding")}  # XL worse
    result = CompareResult(config="c", overrides=(), level="byte", stride=8, window=64, models=models,
                           relative=relative, throughput={}, actions={})  # fmt: skip
    assert SIGN_CONVENTION in result.table() and "+0.7%" in result.table()


def test_the_default_is_a_fixed_number_of_steps():
    assert isinstance(demo.DEFAULT_STEPS, int) and 2000 <= demo.DEFAULT_STEPS <= 3000
    assert demo.choose_steps(None, None) == demo.DEFAULT_STEPS and demo.choose_steps(7, None) == 7


def test_the_embedded_corpus_exists_here():
    corpus = load_corpus("python-stdlib")
    assert all(corpus.has(s) for s in ("train", "valid", "test"))
    assert len(corpus.splits["valid"]) > 10_000 and corpus.level == "byte"
