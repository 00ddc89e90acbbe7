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
    pytest.importorskip(module, reason=f"the ONNX export check needs {module}: pip install 'txl[export]'")

from txl.export import ExportError, check_onnx  # noqa: E402

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
    assert [i.name for i in session.get_inputs()] == ["tokens", "memory_0", "memory_1", "memory_2"]
    assert [o.name for o in session.get_outputs()] == [
        "log_probs",
        "new_memory_0",
        "new_memory_1",
        "new_memory_2",
    ]
    model = load_run(run_dir).model
    for batch in (1, 4):  # the batch is dynamic: exported with 2 rows
        assert check_onnx(model, out, tgt_len=5, mem_len=8, segments=3, batch_size=batch, seed=batch) <= 1e-4


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
    with pytest.raises(ExportError, match=r"pip install 'txl\[export\]'"):
        check_onnx(load_run(run_dir).model, out, tgt_len=5, mem_len=8)
