"""``txl export --format onnx``: the exported graph, run by onnxruntime segment by segment with its memory
carried, gives txl's log-probabilities (within 1e-4) for any batch size."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from txl import TransformerXL, TransformerXLConfig
from txl.cli import main
from txl.interop import txl_to_original
from txl.runs import load_run

for module in ("onnx", "onnxscript", "onnxruntime"):
    pytest.importorskip(
        module, reason=f"the ONNX export check needs {module}: pip install 'transformer-xl[export]'"
    )

from txl.interop.onnx import ExportError, OnnxCheck, check_onnx  # noqa: E402

WORDS = ["<eos>", "<unk>"] + [f"w{i}" for i in range(118)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A converted run (adaptive softmax, div_val 4, per-layer biases, same_length, clamp) and its export."""
    folder = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    config = TransformerXLConfig(
        vocab_size=len(WORDS),
        n_layer=3,
        n_head=2,
        d_head=8,
        d_model=32,
        d_inner=48,
        d_embed=64,
        cutoffs=(20, 40, 80),
        div_val=4,
        mem_len=8,
    )
    model = TransformerXL(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    torch.save(txl_to_original(model), folder / "model.pt")
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    run_dir, out = folder / "run", folder / "model.onnx"
    assert (
        main(
            [
                "convert",
                str(folder / "model.pt"),
                str(run_dir),
                "--mem-len",
                "8",
                "--clamp-len",
                "6",
                "--same-length",
                "--tgt-len",
                "5",
            ]
        )
        == 0
    )
    return run_dir, out


def test_export_cli_checks_against_onnxruntime(exported, capsys):
    run_dir, out = exported
    capsys.readouterr()
    code = main(
        ["export", str(run_dir), "--format", "onnx", "--out", str(out), "--tgt-len", "5", "--mem-len", "8"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads(captured.out)
    assert record["out"] == str(out) and out.is_file() and (record["tgt_len"], record["mem_len"]) == (5, 8)
    assert record["max_abs_diff"] <= 1e-4

    import onnxruntime

    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [
        "tokens",
        "memory_reach",
        "memory_0",
        "memory_1",
        "memory_2",
    ]
    assert [o.name for o in session.get_outputs()] == [
        "log_probs",
        "new_memory_reach",
        "new_memory_0",
        "new_memory_1",
        "new_memory_2",
    ]
    model = load_run(run_dir).model
    for batch in (1, 4):  # the batch is dynamic: exported with 2 rows
        assert (
            check_onnx(
                model, out, tgt_len=5, mem_len=8, check=OnnxCheck(segments=3, batch_size=batch, seed=batch)
            )
            <= 1e-4
        )


def test_the_graph_takes_the_reach_from_zeros_and_resets_a_row(exported):
    """From zeros with reach 0 the first segment is txl's empty-memory start (it differed by up to 0.49 in
    log-probability when the zeros were attended); reach 0 for one row later starts that row anew (as txl's
    starts), reach M attends the whole memory (txl's Memory without reach); the new reach is txl's."""
    import numpy as np
    import onnxruntime

    from txl import Memory

    run_dir, out = exported
    if not out.is_file():
        pytest.skip("needs the export of the test above")
    model = load_run(run_dir).model.eval()
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    tokens = torch.randint(0, len(WORDS), (3, 10), generator=torch.Generator().manual_seed(5))
    zeros = Memory.zeros(model.config, 3, 8)

    def run(segment, memory):
        feeds = [segment.numpy(), memory.reach.numpy(), *(m.numpy() for m in memory.states)]
        got = session.run(None, {i.name: f for i, f in zip(session.get_inputs(), feeds, strict=True)})
        return torch.from_numpy(got[0]), Memory(
            tuple(torch.from_numpy(m) for m in got[2:]), reach=torch.from_numpy(got[1])
        )

    with torch.no_grad():
        first, memory = run(tokens[:, :5], zeros)
        empty = model(tokens[:, :5])
        assert (first - empty.log_probs).abs().max() <= 1e-4
        attended = model(tokens[:, :5], memory=Memory(zeros.states)).log_probs  # the zeros attended
        assert (attended - empty.log_probs).abs().max() > 1e-2
        assert memory.reach.tolist() == [5, 5, 5]
        reset = Memory(memory.states, reach=torch.tensor([5, 0, 5]))
        second, after = run(tokens[:, 5:], reset)
        assert (second[1] - model(tokens[1:2, 5:]).log_probs[0]).abs().max() <= 1e-4  # row 1 anew
        carried = model(tokens[:, 5:], memory=empty.memory).log_probs
        assert (second[[0, 2]] - carried[[0, 2]]).abs().max() <= 1e-4
        assert after.reach.tolist() == [8, 5, 8]
        starts = torch.zeros(3, 10, dtype=torch.bool)
        starts[1, 5] = True
        assert (second - model(tokens, starts=starts).log_probs[:, 5:]).abs().max() <= 1e-4
        full, _ = run(tokens[:, :5], Memory(zeros.states, reach=torch.full((3,), 8)))
        assert (full - attended).abs().max() <= 1e-4
    assert np.isfinite(second.numpy()).all()


def test_the_check_can_fail(exported):
    run_dir, out = exported
    if not out.is_file():
        pytest.skip("needs the export of the test above")
    model = load_run(run_dir).model
    with torch.no_grad():
        model.v.add_(0.05)  # another model than the one exported
    with pytest.raises(ExportError, match="differs from txl"):
        check_onnx(model, out, tgt_len=5, mem_len=8)


def test_export_without_onnxruntime_says_what_to_install(exported, monkeypatch, capsys):
    run_dir, out = exported
    if not out.is_file():
        pytest.skip("needs the export of the test above")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ExportError, match=r"pip install 'transformer-xl\[export\]'"):
        check_onnx(load_run(run_dir).model, out, tgt_len=5, mem_len=8)


def test_export_starts_from_the_settings_txl_eval_uses(exported, tmp_path, monkeypatch, capsys):
    """A run whose [eval] section sets same_length and a clamp that its model trained without (as the
    wt103-base preset): ``txl export`` with no span flags takes the span ``txl eval`` takes, and the graph
    gives the log-probabilities of the model under that span, not under the model's own (which differ)."""
    import shutil

    from txl.config import eval_span

    run_dir, _ = exported
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    config = json.loads((run / "config.json").read_text())
    config["model"].update(same_length=False, clamp_len=None, mem_len=6)
    config["eval"].update(same_length=True, clamp_len=3, mem_len=8, tgt_len=5)
    (run / "config.json").write_text(json.dumps(config))
    data = tmp_path / "data" / "wikitext-103"
    data.mkdir(parents=True)
    words = torch.randint(2, len(WORDS), (600,), generator=torch.Generator().manual_seed(0)).tolist()
    for split in ("train", "valid", "test"):
        (data / f"wiki.{split}.tokens").write_text(" ".join(WORDS[i] for i in words) + "\n", encoding="utf-8")
    monkeypatch.setenv("TXL_DATA_DIR", str(tmp_path / "data"))

    out = tmp_path / "model.onnx"
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out)]) == 0, capsys.readouterr().err
    exported_record = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run), "--quiet", "--json", "--max-tokens", "100"]) == 0, capsys.readouterr().err
    eval_record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    settings = ("tgt_len", "mem_len", "clamp_len", "same_length")
    assert [exported_record[k] for k in settings] == [eval_record[k] for k in settings] == [5, 8, 3, True]
    loaded = load_run(run)
    span = eval_span(loaded.config)
    assert check_onnx(loaded.model, out, tgt_len=5, span=span) <= 1e-4
    with pytest.raises(ExportError, match="differs from txl"):  # the model's own span: another graph
        check_onnx(loaded.model, out, tgt_len=5, mem_len=8)
    # the flags are txl eval's
    assert main(["export", str(run), "--out", str(out), "--no-same-length", "--clamp-len", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["same_length"] is False


def test_export_says_what_it_does_and_passes_on_no_foreign_warnings(trained_run, tmp_path):
    import os
    import subprocess

    out = tmp_path / "tiny.onnx"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "txl", "export", str(trained_run), "--out", str(out), "--no-check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "torchvision" not in proc.stderr and "W1" not in proc.stderr, proc.stderr
    stages = [line for line in proc.stderr.splitlines() if line.startswith("txl export:")]
    assert len(stages) >= 3 and "tracing" in proc.stderr and str(out) in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["out"] == str(out) and out.is_file()


def test_export_on_a_full_disk_fails_in_one_line_naming_out(trained_run, tmp_path, monkeypatch, capsys):
    import errno

    def full(model, args, path, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"partial")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:  # as the exporter passes a failed write on: wrapped, without the path
            raise RuntimeError("Failed to save the ONNX program") from exc

    monkeypatch.setattr(torch.onnx, "export", full)
    out = tmp_path / "full" / "model.onnx"
    out.parent.mkdir()
    code = main(["export", str(trained_run), "--out", str(out), "--no-check"])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("txl export: ")]
    assert code == 2 and len(err) == 1, err  # the stages said, then one error line
    assert err[0].startswith(f"txl: error: --out {out}: no space left on device"), err
    assert list(out.parent.iterdir()) == []  # nothing half written is left
