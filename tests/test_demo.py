"""``txl demo`` wiring: both models train, the comparison table and a sample are printed (shrunk here to a
few steps on a small real text; the real demo runs for minutes on the Python standard library)."""

from __future__ import annotations

import dataclasses
import json
import sysconfig
from pathlib import Path

import txl.demo as demo
from txl.data import load_corpus


def test_demo_trains_both_models_and_prints_the_comparison(tmp_path, monkeypatch, capsys):
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
    monkeypatch.setattr(demo, "_steps_for", lambda config, minutes: 8)
    report = demo.run_demo(tmp_path / "demo", minutes=0.1, progress=False)
    out = capsys.readouterr().out
    assert "transformer-xl" in out and "vanilla" in out and "val bpb" in out
    assert out.rstrip().splitlines()[-1]  # the sample
    assert report["results"]["transformer-xl"]["steps"] == 8 == report["results"]["vanilla"]["steps"]
    assert report["sample"].startswith("def ") and len(report["sample"]) > 4
    saved = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert saved["results"]["vanilla"]["val_bpc"] > 0


def test_the_embedded_corpus_exists_here():
    corpus = load_corpus("python-stdlib")
    assert all(corpus.has(s) for s in ("train", "valid", "test"))
    assert len(corpus.splits["valid"]) > 10_000 and corpus.level == "byte"
