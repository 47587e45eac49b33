"""Serving the page: bind first (so a taken port or a bad host is one line
before anything starts), print the URL, run uvicorn on that socket until
Ctrl-C, then stop cleanly."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Optional, TextIO

import uvicorn
from starlette.applications import Starlette

from logbook.errors import LogbookError
from logbook.schema import LOGBOOK_FILENAME
from logbook.web.app import LOCAL_HOSTS, SkippedDecoder, make_app

DEFAULT_HOST = "127.0.0.1"
"""Only this machine, unless ``--host`` says otherwise."""
DEFAULT_PORT = 8642
"""The port unless ``--port`` says otherwise (0: any free one)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a LogbookError says why not, in one line."""
    if not 0 <= port <= 65535:
        raise LogbookError(f"--port must be 0..65535 (0: any free port), got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise LogbookError(f"--host {host!r} is not an address of this machine ({err.strerror}): "
                           f"use {DEFAULT_HOST}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise LogbookError(f"port {port} on {host} is taken: pass another with --port N (0: any free one)") from None
        raise LogbookError(f"cannot listen on {host}:{port}: {err.strerror}: pass another --host or --port") from None
    sock.listen(64)
    return sock


def url_of(sock: socket.socket) -> str:
    """The URL a browser on this machine opens for ``sock``."""
    host, port = sock.getsockname()[:2]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)
    return f"http://{shown}:{port}/"


def hosts_for(host: str) -> tuple[str, ...]:
    """Host headers the app answers: this machine's names, plus ``host`` itself; any when bound to all."""
    return ("*",) if host in ("0.0.0.0", "::") else (*LOCAL_HOSTS, host)


def make_server(app: Starlette) -> uvicorn.Server:
    """A quiet uvicorn server (no access log) for ``app``."""
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))


def check_root(root: Path) -> None:
    """Refuse a path that is neither a run directory nor a folder of runs."""
    if not root.is_dir():
        raise LogbookError(f"no run or folder at {root}: pass a run directory (runs/NAME) or a folder of runs")
    if not (root / LOGBOOK_FILENAME).is_file() and not any((p / LOGBOOK_FILENAME).is_file() for p in root.iterdir()):
        raise LogbookError(f"{root} holds no logbook and no run directory: pass a run directory or a folder of runs")


def serve(root: Path, out: TextIO, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          decode_skipped: Optional[SkippedDecoder] = None) -> int:
    """Serve the page over ``root`` until Ctrl-C; prints the URL first."""
    check_root(root)
    sock = bind(host, port)
    server = make_server(make_app(root, decode_skipped, allowed_hosts=hosts_for(host)))
    out.write(f"serving {root} read-only at {url_of(sock)} (Ctrl-C stops)\n")
    out.flush()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn stops on the first Ctrl-C, then raises it again for the caller: that is the clean end.
        pass
    finally:
        sock.close()
    out.write("stopped\n")
    return 0
