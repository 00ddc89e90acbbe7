"""What ``txl train`` and ``txl eval`` show: the validation loss in the progress display when it is measured,
a short human summary at the end (the figures rounded, the run folder named), and the JSON record behind
``--json`` (training's is also summary.json in the run folder)."""

from __future__ import annotations

import json
import re

from conftest import write_text_corpus
from txl.cli import main


def _train_argv(corpus, out, *sets: str) -> list[str]:
    argv = ["train", "--config", "tiny", "--out", str(out), "--set", f"data.corpus={json.dumps(str(corpus))}"]
    for item in ("train.steps=4", "train.eval_every=2", "train.log_every=1", "train.eval_tokens=300", *sets):
        argv += ["--set", item]
    return argv


def test_training_shows_the_validation_loss_and_ends_with_a_summary(tmp_path, capsys):
    corpus = write_text_corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    assert main(_train_argv(corpus, run)) == 0
    captured = capsys.readouterr()
    measured = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    periodic = next(r for r in measured if r["split"] == "valid" and not r.get("final"))
    assert f"val_loss={periodic['loss']:.3f}" in captured.err  # the progress display, once measured
    summary = json.loads((run / "summary.json").read_text())
    out = captured.out
    assert not out.lstrip().startswith("{") and len(out.splitlines()) <= 6, out
    assert f"loss {summary['val_loss']:.4f}" in out and f"bpb {summary['val_bpb']:.4f}" in out
    assert f"ppl {summary['val_ppl']:.2f}" in out and str(run) in out and "4 steps" in out
    assert not re.search(r"\d\.\d{8}", out)  # no 16-digit floats
    # which loss is which: the whole split with the last weights, and what the best checkpoint was chosen on
    assert f"valid (whole split, step 4): loss {summary['val_loss']:.4f}" in out
    best = [r for r in measured if r["split"] == "valid" and r["loss"] == summary["best_val_loss"]][-1]
    measured_on = (
        "the whole split" if best.get("final") else f"the first {best['tokens']:,} tokens (train.eval_tokens)"
    )
    assert (
        f"best checkpoint: step {best['step']}, validation loss {best['loss']:.4f} over {measured_on}" in out
    ), out

    assert main([*_train_argv(corpus, tmp_path / "quiet"), "--quiet", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record == json.loads((tmp_path / "quiet" / "summary.json").read_text())
    assert "val_loss" not in captured.err


def test_eval_ends_with_a_summary_and_json_behind_a_flag(trained_run, capsys):
    assert main(["eval", str(trained_run), "--max-tokens", "400", "--quiet", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert main(["eval", str(trained_run), "--max-tokens", "400", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert not out.lstrip().startswith("{") and len(out.splitlines()) <= 3, out
    assert f"loss {record['loss']:.4f}" in out and f"ppl {record['ppl']:.2f}" in out
    assert f"bpb {record['bpb']:.4f}" in out and f"{record['tokens']:,} tokens" in out
    assert str(trained_run) in out and f"step {record['step']}" in out
