"""What ``txl serve`` shows about its run: the model card (``GET /v1/model``), with the page's defaults, and
the page itself. Everything here comes from the loaded run and its folder's summary: nothing reads the corpus,
so the server starts in the time it takes to load the checkpoint."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..config import config_to_dict
from ..runs import LoadedRun, RunPaths
from .score import scoring_lengths

__all__ = ["default_prompt", "model_card", "page"]


def default_prompt(run: LoadedRun) -> str:
    """The page's default prompt: the run's ``generate.prompt``, else a newline (a document's start)."""
    prompt = run.config.generate.prompt
    return prompt if prompt is not None else "\n"


def model_card(run: LoadedRun, *, name: str, run_dir: Path, limits: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/model``: the run, its size, the page's defaults, the scoring lengths, the server's limits,
    the config and the training summary (None when the run folder has none)."""
    try:
        summary = json.loads(RunPaths(run_dir).summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    generate = run.config.generate
    lengths = scoring_lengths(run.config, memory=True)
    tgt_len, span = lengths.tgt_len, lengths.span
    return {
        "id": name,
        "object": "model",
        "owned_by": "txl",
        "run_dir": str(run_dir),
        "checkpoint": run.checkpoint.name,
        "step": run.step,
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "device": str(next(run.model.parameters()).device),
        "vocab": {"kind": run.vocab.kind, "size": len(run.vocab)},
        "attention": run.config.model.attention,
        "defaults": {
            "prompt": default_prompt(run),
            "max_tokens": min(generate.max_new_tokens, limits["max_tokens"]) or 1,
            "temperature": generate.temperature,
            "top_k": generate.top_k,
            "top_p": generate.top_p,
        },
        "score": {"tgt_len": tgt_len, "mem_len": span.mem_len},
        "limits": limits,
        "config": config_to_dict(run.config),
        "summary": summary,
    }


def page() -> str:
    """The page (one offline HTML file)."""
    return resources.files("txl.serve").joinpath("static/index.html").read_text(encoding="utf-8")
