"""A TCP port for a process group's rendezvous (torch.distributed's store, torchrun's
``--master-port``, the health check's group tests).

A port is chosen on the master's node and bound by a later process (the rank's store), so
something else may take it in between. Asking the kernel for any free port (``bind(0)``)
makes that likely on a busy node: the port comes from the kernel's ephemeral range, the
range every outgoing connection and every other ``bind(0)`` draws from (Ray's daemons and
workers, gloo's pair sockets, another job's ranks), and a rank's store was seen failing
with EADDRINUSE that way. So the port is drawn at random from below the ephemeral range
and above the ports Ray's workers take by number: there, only a process that asks for
that very number can take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Optional

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)
"""Linux's default, where the file cannot be read."""
RAY_WORKER_PORT_MAX = 19999
"""``ray start``'s default ``--max-worker-port``: Ray's workers bind 10002-19999 by number."""
TRIES = 64
"""Random draws before falling back to any free port (a range that full is no longer quiet)."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last)."""
    try:
        first, last = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return first, last


def bindable(port: int) -> bool:
    """True when a listening socket can take ``port`` on every address now."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def any_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def rendezvous_port(rng: Optional[random.Random] = None, ephemeral: Optional[tuple[int, int]] = None) -> int:
    """A free port between Ray's worker ports and the ephemeral range, drawn at random (two
    drivers on one node rarely draw the same); any free port when that gap is too narrow or
    full."""
    rng = rng or random.Random()
    first_ephemeral = (ephemeral or ephemeral_range())[0]
    low, high = RAY_WORKER_PORT_MAX + 1, first_ephemeral - 1
    if high - low < TRIES:
        return any_free_port()
    for _ in range(TRIES):
        port = rng.randint(low, high)
        if bindable(port):
            return port
    return any_free_port()
