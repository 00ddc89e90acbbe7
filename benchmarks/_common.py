"""Helpers shared by the benchmark scripts: timing, peak RSS from /proc, Hugging Face's TransfoXL built with
the same shape as a txl config, tables drawn into a page between markers. Scripts import it as ``_common`` (a script's own folder is on ``sys.path``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from txl import TransformerXLConfig

__all__ = ["timed", "status_mib", "reset_peak_rss", "hf_config", "render_marked"]


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def status_mib(field: str) -> float:
    """VmRSS or VmHWM (the peak RSS) of this process from /proc/self/status, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak_rss() -> None:
    """Reset the kernel's peak RSS counter of this process (Linux), so VmHWM measures from now."""
    Path("/proc/self/clear_refs").write_text("5")


def hf_config(config: TransformerXLConfig, *, tgt_len: int):
    """Hugging Face ``TransfoXLConfig`` (transformers 4.35.2) of the same shape as a txl config: post-norm,
    tied weights and projections, shared u and v, no dropout, no end-of-sequence token."""
    from transformers import TransfoXLConfig
    from transformers.utils import logging

    logging.set_verbosity_error()
    return TransfoXLConfig(
        vocab_size=config.vocab_size,
        cutoffs=list(config.cutoffs),
        d_model=config.d_model,
        d_embed=config.embed_dim,
        n_head=config.n_head,
        d_head=config.d_head,
        d_inner=config.d_inner,
        n_layer=config.n_layer,
        mem_len=config.mem_len,
        tgt_len=tgt_len,
        div_val=config.div_val,
        adaptive=bool(config.cutoffs),
        same_length=config.same_length,
        clamp_len=-1 if config.clamp_len is None else config.clamp_len,
        dropout=config.dropout,
        dropatt=config.dropatt,
        tie_projs=[False] + [config.tie_projs] * len(config.cutoffs),
        untie_r=not config.share_rel_bias,
        pre_lnorm=config.pre_norm,
        eos_token_id=None,
        pad_token_id=0,
    )


def render_marked(doc: str, drawn: dict[str, str], mark: str) -> str:
    """``doc`` with each of its marked blocks replaced by its drawing: the text between ``mark.format(NAME,
    "start")`` and ``mark.format(NAME, "end")`` (``mark`` as ``"<!-- rl-suite:{}:{} -->"``) becomes
    ``drawn[NAME]``; markers missing from ``doc`` change nothing."""
    for name, text in drawn.items():
        start, end = mark.format(name, "start"), mark.format(name, "end")
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        doc = pattern.sub(lambda _m, t=text.rstrip("\n"), s=start, e=end: f"{s}\n{t}\n{e}", doc)
    return doc
