"""examples/xl_vs_vanilla.ipynb runs from top to bottom (with a budget of a few training steps, through
TXL_NOTEBOOK_STEPS), so the walkthrough never rots. Needs nbclient, ipykernel and matplotlib
(``pip install -e '.[notebook]'``, as .ci/run does); skipped with that reason when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "xl_vs_vanilla.ipynb"
WHY = "the notebook check needs nbclient, nbformat, ipykernel and matplotlib: pip install -e '.[notebook]'"


@pytest.mark.slow
def test_the_notebook_runs_on_a_small_budget(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason=WHY)
    nbclient = pytest.importorskip("nbclient", reason=WHY)
    pytest.importorskip("ipykernel", reason=WHY)
    pytest.importorskip("matplotlib", reason=WHY)
    monkeypatch.setenv("TXL_NOTEBOOK_STEPS", "12")
    monkeypatch.setenv("TXL_NOTEBOOK_OUT", str(tmp_path / "runs"))
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    if SHARED_DATA.is_dir() and not os.environ.get("TXL_DATA_DIR"):
        monkeypatch.setenv("TXL_DATA_DIR", str(SHARED_DATA))  # the books corpus; without it, the stdlib
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    text = "".join(out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", []))
    assert "perplexity" in text and "Transformer-XL (memory)" in text and "vanilla (sliding window)" in text
    assert "PROMPT:" in text and "VANILLA:" in text
    assert "exact recall" in text and "chance" in text
    images = [
        out
        for cell in notebook.cells
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 2  # the training curves and the recall figure
