"""Start rank processes without paying Python's and torch's start-up for each:
this process imports the trainer once (torch, torch.distributed, DTensor,
DCP: about 4 CPU-seconds), then forks one child per rank. Each child is a
process of its own (its own session, pid, file descriptors 1 and 2, and
environment: rank, world size, rendezvous) that runs ``rank_worker.main`` as
``python rank_worker.py SPEC OUT`` would, and exits with what that process's
exit code would be (0, or 1 and a traceback on stderr).

Why forking is safe here: this process only imports (no torch op has run, so
no OpenMP or intra-op thread exists yet) and is itself started with the ranks'
``OMP_NUM_THREADS=1``, which OpenMP reads when torch loads.

Protocol, one JSON line each way (``tests/trainer/conftest.py`` speaks it):
stdin ``{"args": [SPEC, OUT], "env": {...}, "stderr": PATH, "exit": PATH}``,
stdout ``{"pid": PID}``. When a child ends its exit code (negative: the
signal that ended it) is written to the ``exit`` path (atomically), since
only this process, its parent, can reap it. At end of input, this process
kills the children still running and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rank_worker  # noqa: E402 - the imports paid once (trainer.loop, torch, ...)

PRELOAD = ("torch.distributed.checkpoint", "torch.distributed.tensor.parallel", "torch.distributed.pipelining",
           "torch.distributed.fsdp", "trainer.parallel.engine")
"""Imported on first use in a rank: imported here once instead."""


def _child(request: dict) -> None:
    """In the forked child: be ``python rank_worker.py SPEC OUT``, then exit with its code."""
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((0, null), (1, null), (2, err)):
        os.dup2(target, fd)
    os.close(null)
    os.close(err)
    sys.argv = [rank_worker.__file__, *request["args"]]
    code = 0
    try:
        rank_worker.main(*request["args"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - an uncaught exception: a traceback and 1, as python does
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _record(pid: int, status: int, exits: dict[int, str]) -> None:
    path = exits.pop(pid, None)
    if path is None:
        return
    code = os.waitstatus_to_exitcode(status)
    partial = f"{path}.partial"
    Path(partial).write_text(str(code))
    os.replace(partial, path)


def _reap(exits: dict[int, str]) -> None:
    while exits:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _record(pid, status, exits)


def serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    exits: dict[int, str] = {}
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        _reap(exits)
        if not ready:
            continue
        chunk = os.read(0, 65536)  # unbuffered: select must see every byte not yet consumed
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request)
            exits[pid] = request["exit"]
            sys.stdout.write(json.dumps({"pid": pid}) + "\n")
            sys.stdout.flush()
    for pid in list(exits):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while exits:
        pid, status = os.waitpid(-1, 0)
        _record(pid, status, exits)


if __name__ == "__main__":
    serve()
