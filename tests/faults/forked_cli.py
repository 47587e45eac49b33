"""Run many `python -m runmgr ARGS...` commands as real processes without paying
Python's and the imports' start-up for each: this process imports runmgr's CLI
(and the modules its refusals reach) once, then forks one child per command.

Each child is a process of its own, in its own session, with its own file
descriptors 1 and 2 (files), and runs ``runmgr/__main__.py`` as ``python -m
runmgr`` does (``runpy``, ``sys.argv``); its exit code is what that process's
exit code would be: ``sys.exit``'s, 1 and a traceback on stderr for an uncaught
exception (atexit handlers run, streams flushed). Anything the preloaded imports
write is the server's stderr, which the caller adds to every case's.

    python tests/faults/forked_cli.py CASES.json RESULTS.json

CASES.json: {"timeout_s": float, "parallel": int, "cases": [{"argv": [...], "stdout": path, "stderr": path}]}
RESULTS.json: {"codes": exit codes (None: killed after timeout_s), "seconds": how long each took},
in the order of the cases.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time

PRELOAD = [
    # What `python -m runmgr` imports first, and what its refusals import lazily (cheap
    # modules without torch or Ray; a child imports anything else itself).
    "runmgr.cli", "runmgr.config.compose", "runmgr.rundir", "trainer.data", "trainer.data.prepare",
    "runmgr.status", "logbook.cli", "logbook.markdown", "runmgr.replay", "runmgr.logbook_samples",
    "runmgr.healthcheck.command", "runmgr.lint.command", "runmgr.precision.command",
    # What Hydra imports on its first compose (its plugin scan reads the installed packages' metadata).
    "importlib.metadata", "email.parser", "omegaconf._impl", "antlr4.LL1Analyzer",
    "hydra._internal.config_loader_impl",
]


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the scan for Hydra's plugins: once per process, the same for every command


def _child(case: dict) -> None:
    """In the forked child: be `python -m runmgr *argv`, then exit with its code."""
    import atexit
    import runpy
    import traceback

    os.setsid()
    for fd, path in ((1, case["stdout"]), (2, case["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["-m", *case["argv"]]  # runpy puts __main__.py's path first, as `python -m` does
    code = 0
    try:
        runpy.run_module("runmgr", run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # what the interpreter makes of sys.exit's argument
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: a traceback and 1
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = code or 120  # what Python exits with when flushing at exit fails
    os._exit(code & 0xFF)


def main(cases_file: str, results_file: str) -> int:
    spec = json.loads(open(cases_file).read())
    cases, timeout_s, parallel = spec["cases"], spec["timeout_s"], max(1, spec["parallel"])
    sys.path[0] = os.getcwd()  # as `python -m` has it: the folder it runs in, not this file's
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    results: list = [None] * len(cases)
    seconds: list = [None] * len(cases)
    running: dict[int, tuple[int, float]] = {}  # pid -> (case index, deadline)
    todo = list(range(len(cases)))
    while todo or running:
        while todo and len(running) < parallel:
            index = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                try:
                    _child(cases[index])
                finally:
                    os._exit(121)  # never back into the server's loop
            seconds[index] = time.monotonic()
            running[pid] = (index, seconds[index] + timeout_s)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for late, (index, deadline) in list(running.items()):
                if now > deadline:
                    try:
                        os.killpg(late, signal.SIGKILL)  # the child and whatever it started
                    except ProcessLookupError:
                        pass
            time.sleep(0.01)
            continue
        index, deadline = running.pop(pid)
        seconds[index] = round(time.monotonic() - seconds[index], 3)
        if time.monotonic() > deadline and os.WIFSIGNALED(status):
            results[index] = None
        else:
            results[index] = os.waitstatus_to_exitcode(status)
    with open(results_file, "w") as out:
        json.dump({"codes": results, "seconds": seconds}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
