"""``txl serve``: a run over HTTP (OpenAI-shaped completions, scores, a web page)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from ..config import ConfigError
from . import _non_negative_int, _port, _positive_float, _positive_int
from .command import Command, Output
from .common import check_device
from .options import CHECKPOINT_HELP, given, settings_from

__all__ = ["SERVE"]


def _cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import require_server_packages, serve

    require_server_packages()
    from ..serve.state import ServeSettings

    check_device(args.device)
    key = args.api_key if args.api_key is not None else os.environ.get("TXL_API_KEY") or None
    if key is not None and not key.strip():
        raise ConfigError("--api-key must not be empty")
    if key is not None and key != key.strip():
        raise ConfigError("--api-key must not start or end with spaces (a header's value cannot)")
    limits = settings_from(ServeSettings, args, max_tokens=args.max_tokens_limit, api_key=key)
    serve(Path(args.run_dir), settings=limits, **given(args, "device", "checkpoint"))
    return 0


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _byte_size(text: str) -> int:
    """A positive number of bytes: digits, and K, M, G or T for 1024, 1024², 1024³, 1024⁴ (``4G``)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    value = int(match.group(1)) * _UNITS[match.group(2).upper()] if match else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of bytes (4096, 512M, 4G), got {text}")
    return value


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument("--port", type=_port, default=8000, help="port (default: 8000; 0: any free port)")
    p.add_argument(
        "--max-tokens-limit",
        type=_positive_int,
        default=1024,
        help="the largest max_tokens a request may ask for (default: 1024)",
    )
    p.add_argument(
        "--max-prompt-chars",
        type=_positive_int,
        default=20_000,
        help="the longest prompt or scored text, in characters (default: 20000)",
    )
    p.add_argument(
        "--queue-size",
        type=_non_negative_int,
        default=8,
        help="requests that may wait while --max-batch run; more get 429 (default: 8)",
    )
    p.add_argument(
        "--max-batch",
        type=_positive_int,
        default=16,
        help="requests (rows) decoded together, each as a row of one cache (default: 16)",
    )
    p.add_argument(
        "--max-sessions",
        type=_positive_int,
        default=1000,
        help="sessions (memories kept across requests) held in memory at once; more get 429 (default: 1000); "
        "with --sessions-dir, the least recently used idle ones leave memory instead (they stay on disk)",
    )
    p.add_argument(
        "--session-ttl",
        type=_positive_float,
        default=600.0,
        help="seconds an idle session is kept (default: 600.0)",
    )
    p.add_argument(
        "--sessions-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep every session in DIR (written after each request that changes it): sessions survive a "
        "restart, and servers of one run may share DIR (default: none, sessions in memory only)",
    )
    p.add_argument(
        "--sessions-max-bytes",
        type=_byte_size,
        default="4G",  # argparse reads a text default through the type: 4 GiB
        metavar="BYTES",
        help="the most bytes of session files in --sessions-dir; the oldest idle sessions are deleted to stay "
        "under it (default: 4G)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="every request (but the page and /v1/health) must send 'Authorization: Bearer KEY' "
        "(default: $TXL_API_KEY; none: no key)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info, one line per request)",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="decode with the step compiled ahead of time (C++, once per set of sizes, kept in "
        "~/.cache/txl/compiled), compiled or loaded at start: faster per token; CPU and float32 only",
    )
    p.add_argument("--checkpoint", default="best", help=CHECKPOINT_HELP)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or auto")


SERVE = Command(
    name="serve",
    help="serve a run over HTTP: OpenAI-shaped completions, scores, a web page",
    arguments=_arguments,
    handler=_cmd_serve,
    writes=(Output("sessions_dir", "--sessions-dir"),),
    workload="tokens",
    lower="the requests' max_tokens (--max-tokens-limit)",
)
"""``txl serve``."""
