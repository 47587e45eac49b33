"""Start test processes without paying Python's and the imports' start-up for
each: a server process imports what they import once, then forks one child
per request. A child is a process of its own (its own pid, session, working
directory, environment, file descriptors 0-2) that runs a module as ``python
-m MODULE ARGS`` or a script as ``python SCRIPT ARGS`` would, and ends with
what that process's exit code would be: ``sys.exit``'s, or 1 and a traceback
on stderr for an uncaught exception (atexit handlers run, streams flushed).

Used for the trainer's rank processes (torch, torch.distributed, DTensor, DCP:
about 4 CPU-seconds a rank; tests/trainer/conftest.py) and for short ``runmgr``
commands (the CLI, Hydra, the config schema; tests/conftest.py). Forking is
safe because the server only imports (no thread, no torch op, no Ray) and is
started with the environment its children's libraries read at load time
(``OMP_NUM_THREADS`` for ranks). What a child's environment changes that a
preloaded module read at import is not seen: preload only modules that read
nothing from the environment then.

Protocol, one JSON line each way on the server's stdin/stdout: in ``{"module"
or "script": ..., "args": [...], "cwd": ..., "env": {...}, "stdin": PATH or null (/dev/null),
"stdout": PATH or null, "stderr": PATH, "exit": PATH, "append": BOOL}``, out ``{"pid": PID}``. When a child ends,
its exit code (negative: the signal that ended it) is written to ``exit``
atomically: only the server, its parent, can reap it. At end of input the
server kills the children still running and exits.

    python tests/forkserver.py MODULE[:FUNCTION_TO_CALL]...
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

# ---- the client: what the tests' fixtures use -------------------------------------------------


class ForkedProcess:
    """A child of a :class:`ForkServer`: what the tests use of ``subprocess.Popen``
    (``pid``, ``poll``, ``wait``, ``returncode``, ``kill``)."""

    def __init__(self, pid: int, exit_file: Path) -> None:
        self.pid = pid
        self.exit_file = exit_file
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.exit_file.exists():
            self.returncode = int(self.exit_file.read_text())
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)  # type: ignore[arg-type]
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def wait_or_kill(self, timeout: float) -> int:
        """:meth:`wait`; a child still running after ``timeout`` is killed (and reaped) first,
        and the timeout raised."""
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """A running server (see the module's doc) and how to ask it for a child."""

    def __init__(self, preload: list[str], env: Optional[dict] = None) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)

    @classmethod
    def forked(cls, preload: list[str]) -> "ForkServer":
        """A server forked from this process instead of a new Python: what this process imported
        is not imported again (bench/accelerator_check.py's dry run, itself forked from the tests'
        CLI fork server), ``preload`` is imported in the server. Call it while this process has
        started no thread and run no torch op, as the server's own start (the module's doc)."""
        server = cls.__new__(cls)
        server.proc = _ForkedServerProcess(preload)
        return server

    def start(self, args: list[str], *, module: Optional[str] = None, script: Optional[str] = None,
              cwd: str, env: dict, stderr: Path, stdout: Optional[Path] = None, append: bool = False,
              exit_file: Optional[Path] = None, stdin: Optional[Path] = None) -> ForkedProcess:
        """``append``: the output files are added to, not replaced (``stdout`` may be ``stderr``:
        one file, as ``stderr=STDOUT`` makes it); ``exit_file``: where the exit code goes (beside
        ``stderr`` unless given); ``stdin``: a file the child reads as its standard input (none:
        /dev/null)."""
        exit_file = exit_file or stderr.with_name(stderr.name + ".exit")
        exit_file.unlink(missing_ok=True)
        request = {"module": module, "script": script, "args": args, "cwd": cwd, "env": env, "append": append,
                   "stdout": str(stdout) if stdout else None, "stderr": str(stderr), "exit": str(exit_file),
                   "stdin": str(stdin) if stdin else None}
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the fork server ended (exit {self.proc.wait()})"
        return ForkedProcess(json.loads(line)["pid"], exit_file)

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]  # it kills the children still running
        self.proc.wait(timeout=60)


class _ForkedServerProcess:
    """What :class:`ForkServer` uses of its server's ``Popen`` (``stdin``, ``stdout``, ``wait``),
    for a server forked from this process: :func:`serve` on a pair of pipes."""

    def __init__(self, preload: list[str]) -> None:
        requests, requests_w = os.pipe()
        replies_r, replies = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the server: requests on its stdin, replies on its stdout
            code = 0
            try:
                os.dup2(requests, 0)
                os.dup2(replies, 1)
                for fd in (requests, requests_w, replies_r, replies):
                    os.close(fd)
                # Streams of its own on fds 1 and 2, as a new Python's (its children write through
                # them too): this process's may be another's (pytest's capture), not the fds.
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                serve(preload)
            except BaseException:  # noqa: BLE001 - said on stderr; the client sees the pipe close
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(requests)
        os.close(replies)
        self.stdin = os.fdopen(requests_w, "w")
        self.stdout = os.fdopen(replies_r, "r")

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)  # type: ignore[arg-type]
            time.sleep(0.02)


# ---- the server ----------------------------------------------------------------------------------


def _redirect(request: dict) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request.get("append") else os.O_TRUNC)
    err = os.open(request["stderr"], flags, 0o644)
    if request["stdout"] == request["stderr"]:
        out = err
    else:
        out = os.open(request["stdout"], flags, 0o644) if request["stdout"] else null
    source = os.open(request["stdin"], os.O_RDONLY) if request.get("stdin") else null
    for fd, target in ((0, source), (1, out), (2, err)):
        os.dup2(target, fd)
    for fd in {null, source, out, err}:
        os.close(fd)


def _forget_preloaded(module: str) -> None:
    """A new ``python -m MODULE`` has no MODULE in ``sys.modules`` when it runs it as
    ``__main__``; a preloaded one (trainer.data.prepare, say) would make runpy warn on stderr
    that it runs the module a second time. A package's is its ``__main__``: nothing to forget."""
    loaded = sys.modules.get(module)
    if loaded is not None and not hasattr(loaded, "__path__"):
        del sys.modules[module]


def _child(request: dict) -> None:
    """In the forked child: be ``python -m MODULE ARGS`` or ``python SCRIPT ARGS``, then exit."""
    import atexit
    import runpy
    import traceback

    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _redirect(request)
    code = 0
    try:
        if request["module"]:
            sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first, as `python -m` does
            sys.path[0] = os.getcwd()
            _forget_preloaded(request["module"])
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [request["script"], *request["args"]]
            sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
            runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as exc:  # what the interpreter makes of sys.exit's argument
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: a traceback and 1, as python does
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = code or 120  # what Python exits with when flushing at exit fails
    os._exit(code & 0xFF)  # what the exit status keeps of it


def _record(pid: int, status: int, exits: dict[int, str]) -> None:
    path = exits.pop(pid, None)
    if path is None:
        return
    partial = f"{path}.partial"
    Path(partial).write_text(str(os.waitstatus_to_exitcode(status)))
    os.replace(partial, path)


def _reap(exits: dict[int, str], block: bool = False) -> None:
    while exits:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _record(pid, status, exits)


def serve(preload: list[str]) -> None:
    import importlib
    import select

    for name in preload:  # MODULE, or MODULE:FUNCTION (dotted) to call once imported
        module_name, _, function = name.partition(":")
        target = importlib.import_module(module_name)
        if function:
            for attribute in function.split("."):
                target = getattr(target, attribute)
            target()
    sys.stdout.flush()
    exits: dict[int, str] = {}
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02)
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
    _reap(exits, block=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
