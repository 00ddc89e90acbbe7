"""``txl serve``: a local HTTP server for a trained run: OpenAI-shaped completions (streamed, batched), per-token
surprisal with and without memory, sessions, the model card and a page. :func:`serve` loads, binds and runs
the application of :mod:`txl.serve.app` (``pip install 'transformer-xl[serve]'``); :mod:`txl.serve.score` needs torch only.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TxlError
from .score import Scores, score_tokens, scoring_lengths, token_pieces

if TYPE_CHECKING:
    from .state import ServeSettings

__all__ = [
    "serve",
    "listening_note",
    "require_server_packages",
    "Scores",
    "score_tokens",
    "scoring_lengths",
    "token_pieces",
    "INSTALL_HINT",
]

INSTALL_HINT = "pip install 'transformer-xl[serve]'"


def require_server_packages() -> None:
    """Refuse, in one line naming the extra, when FastAPI or uvicorn is missing."""
    missing = []
    for module in ("fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise TxlError(f"txl serve needs {' and '.join(missing)}: {INSTALL_HINT}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port); one line naming the flag on failure."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TxlError(f"host {host}: cannot resolve it ({exc.strerror})", fields=("host",)) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise TxlError(
            f"host {host} port {port}: cannot listen there ({exc.strerror})", fields=("host", "port")
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def listening_note(host: str, port: int, *, keyed: bool) -> str:
    """The line ``txl serve`` prints about who can reach it: a warning for an address other machines can reach
    without an API key."""
    if _is_loopback(host):
        return (
            f"txl: listening on {host} only: this machine can reach it, others cannot "
            "(pass --host 0.0.0.0 to listen on every interface)"
        )
    if keyed:
        return (
            f"txl: listening on {host}: anyone who can reach this machine on port {port} can reach the "
            "server; every request but the page and /v1/health needs the API key"
        )
    return (
        f"txl: warning: listening on {host} without an API key: anyone who can reach this machine on port "
        f"{port} can use the model (pass --api-key KEY or set TXL_API_KEY)"
    )


def serve(
    run_dir: Path,
    settings: ServeSettings | None = None,
    *,
    device: str = "cpu",
    checkpoint: str = "best",
    out: Any = None,
) -> None:
    """Load ``run_dir`` and serve it, where and as ``settings`` say (None: the defaults), until Ctrl-C (then
    return) or SIGTERM. Prints where it listens (to ``out``, default stdout) and whether other machines can
    reach it."""
    require_server_packages()
    import uvicorn

    from ..runs import load_run
    from .app import create_app
    from .server import server_config
    from .state import ServeSettings

    settings = ServeSettings() if settings is None else settings
    host, port = settings.host, settings.port
    out = sys.stdout if out is None else out
    run = load_run(Path(run_dir), checkpoint=checkpoint, device=device)
    app = create_app(run, run_dir=Path(run_dir), settings=settings)
    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(
        f"txl: serving {run_dir} (checkpoint {run.checkpoint.name}, step {run.step}) on "
        f"http://{shown}:{bound_port}/",
        file=out,
        flush=True,
    )
    print(
        listening_note(bound_host, bound_port, keyed=settings.api_key is not None),
        file=out,
        flush=True,
    )
    files = app.state.txl.files
    if files is not None:
        print(f"txl: sessions kept in {files.folder} ({files.count} there now)", file=out, flush=True)
    server = uvicorn.Server(server_config(app, log_level=settings.log_level))
    try:
        server.run(sockets=[sock])
    except (
        KeyboardInterrupt
    ):  # uvicorn has shut down cleanly, then passes Ctrl-C on: that is how one stops it
        pass
    finally:
        sock.close()
    print("txl: server stopped", file=out, flush=True)
