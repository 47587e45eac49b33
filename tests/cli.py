"""``python -m runmgr ARGS`` for the tests, run as a real process of its own:
forked from the session's CLI fork server (tests/forkserver.py, started by
``tests/conftest.py``), which imported runmgr's CLI, Hydra and the config
schema once; a command costs a fork instead of a Python start-up and a
second or more of imports. Outside a pytest session (no server): a new
Python, as before."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from tests.forkserver import ForkServer

ROOT = Path(__file__).resolve().parents[1]

CLI_PRELOAD = [
    # What `python -m runmgr` imports first, and what its commands import lazily that reads
    # nothing a test changes from the environment at import. torch: the dry-run's device count
    # (trainer/device.py); its OpenMP reads OMP_NUM_THREADS at load, which no command sets. Not
    # Ray: its constants read RAY_* variables at import, which tests set (a child imports it).
    "torch", "trainer.device", "runmgr.cli", "runmgr.config.compose", "runmgr.rundir", "runmgr.launch", "trainer.data", "trainer.data.prepare",
    "runmgr.config.compose:schema_tree", "runmgr.status", "logbook.cli", "logbook.markdown", "runmgr.replay", "runmgr.logbook_samples",
    "runmgr.healthcheck.command", "runmgr.lint.command", "runmgr.precision.command", "runmgr.simulate.ettr",
    # What Hydra imports on its first compose, and its plugin scan (once per process).
    "importlib.metadata", "email.parser", "omegaconf._impl", "antlr4.LL1Analyzer",
    "hydra._internal.config_loader_impl", "hydra.core.plugins:Plugins.instance",
]


class _Session:
    """The running server, while a pytest session holds one."""

    server: Optional[ForkServer] = None


@contextmanager
def serving() -> Iterator[None]:
    """Start the CLI fork server for the block (the test session)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    _Session.server = ForkServer(CLI_PRELOAD, env)
    try:
        yield
    finally:
        server, _Session.server = _Session.server, None
        server.close()


def runmgr(*args: str, cwd: Path = ROOT, env: Optional[dict] = None, timeout: float = 300,
           script: Optional[Path] = None, module: str = "runmgr",
           stdin: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``python -m runmgr *args`` in ``cwd`` with ``env`` (this process's by default), its
    output captured as text; ``timeout`` bounds the wait on a stuck command, it is no claim
    about speed. ``script``: ``python SCRIPT *args`` instead (a script that runs runmgr);
    ``module``: ``python -m MODULE *args`` (the trainer's own commands: torch and the data
    preparation are preloaded here too); ``stdin``: a file read as its standard input (none:
    nothing to read)."""
    env = dict(os.environ if env is None else env)
    server = _Session.server
    if server is None:
        how = [str(script)] if script is not None else ["-m", module]
        with open(stdin if stdin is not None else os.devnull, "rb") as source:
            return subprocess.run([sys.executable, *how, *args], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout, stdin=source)
    with tempfile.TemporaryDirectory(prefix="runmgr-cli-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        child = server.start(list(args), module=None if script is not None else module,
                             script=str(script) if script is not None else None, cwd=str(cwd), env=env,
                             stdout=out, stderr=err, stdin=stdin)
        code = child.wait_or_kill(timeout)
        return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code,
                                           out.read_text(errors="replace"), err.read_text(errors="replace"))


def runmgr_all(commands: list[list[str]], cwd: Path, env: dict, timeout: float, at_once: int = 2) -> list[Optional[int]]:
    """Run each of ``commands`` (``runmgr`` arguments) as its own process, ``at_once`` at a
    time, in ``cwd`` with ``env``; command ``i`` writes its output to :func:`output_paths`
    ``(cwd, i)``. Returns the exit codes in order (None: still running after ``timeout``
    seconds, then killed)."""
    server = _Session.server
    assert server is not None, "runmgr_all needs the session's CLI fork server (tests/conftest.py)"
    codes: list[Optional[int]] = [None] * len(commands)
    running: dict[int, tuple] = {}  # index -> (child, deadline)
    todo = list(range(len(commands)))
    while todo or running:
        while todo and len(running) < at_once:
            index = todo.pop(0)
            out, err = output_paths(cwd, index)
            child = server.start(commands[index], module="runmgr", cwd=str(cwd), env=env, stdout=out, stderr=err)
            running[index] = (child, time.monotonic() + timeout)
        for index, (child, deadline) in list(running.items()):
            if child.poll() is not None:
                codes[index] = child.returncode
                del running[index]
            elif time.monotonic() > deadline:
                child.kill()
                child.wait()
                del running[index]  # its code stays None
        time.sleep(0.02)
    return codes


def output_paths(cwd: Path, index: int) -> tuple[Path, Path]:
    """Where :func:`runmgr_all`'s command ``index`` writes its stdout and stderr: beside ``cwd``,
    so that the folder the commands run in holds only what they write themselves."""
    folder = Path(cwd).parent / f"{Path(cwd).name}-cli-output"
    folder.mkdir(exist_ok=True)
    return folder / f"{index}.out", folder / f"{index}.err"


def start_script(script: Path, args: list[str], cwd: Path, env: dict, stdout: Path, stderr: Path):
    """``python SCRIPT *args`` started in the background, its output written to ``stdout`` and
    ``stderr``: forked from the session's CLI fork server (torch imported once), or a new Python
    outside a session. What it returns has ``subprocess.Popen``'s ``wait`` and ``returncode``."""
    server = _Session.server
    if server is None:
        with open(stdout, "w") as out, open(stderr, "w") as err:
            return subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env, stdout=out, stderr=err)
    return server.start(list(args), script=str(script), cwd=str(cwd), env=env, stdout=stdout, stderr=stderr)


def start_runmgr(args: list[str], cwd: Path, env: Optional[dict], log: Path, errors: Optional[Path] = None):
    """``python -m runmgr *args`` started in the background, its stdout and stderr appended to
    ``log`` (``errors``: its stderr there instead): forked from the session's CLI fork server (a
    launch's driver then pays no Python start-up and no import of torch or the CLI: about 1.9
    CPU-seconds a launch), or a new Python outside a session. What it returns has
    ``subprocess.Popen``'s ``pid``, ``poll``, ``wait``, ``returncode``, ``send_signal`` and
    ``kill``; the child leads a session of its own."""
    env = dict(os.environ if env is None else env)
    errors = errors or log
    server = _Session.server
    if server is None:
        with open(log, "a") as out, open(errors, "a") as err:
            return subprocess.Popen([sys.executable, "-m", "runmgr", *args], cwd=cwd, stdout=out,
                                    stderr=subprocess.STDOUT if errors == log else err, start_new_session=True,
                                    env=env)
    return server.start(list(args), module="runmgr", cwd=str(cwd), env=env, stdout=log, stderr=errors, append=True,
                        exit_file=log.with_name(log.name + f".exit{time.monotonic_ns()}"))


def lines_of(path: Path, child, until: Callable[[str], bool], after: int = 0) -> list[str]:
    """The lines ``child`` (a :func:`start_runmgr` process) writes to ``path``, read as it writes
    them, up to the first after the first ``after`` lines that ``until`` holds of, or all of them
    once it ended. The command's own output says when: the wait is on it, not on a length of time."""
    seen: list[str] = []
    with open(path, "a+", encoding="utf-8", errors="replace") as out:
        out.seek(0)
        pending = ""
        while True:
            ended = child.poll() is not None  # read after: the lines written before its end are in
            pending += out.read()
            *complete, pending = pending.split("\n")
            for line in complete:
                seen.append(line + "\n")
                if len(seen) > after and until(line):
                    return seen
            if ended:
                return seen + ([pending] if pending else [])
            time.sleep(0.05)
