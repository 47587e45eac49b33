"""Fixtures of the trainer's tests: launching real ranks as processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rank_worker.py")
ZYGOTE = Path(__file__).with_name("rank_zygote.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class ForkedRank:
    """A rank forked by :class:`RankZygote`: what the tests use of ``subprocess.Popen``
    (``pid``, ``poll``, ``wait``, ``returncode``, ``kill``). Its exit code comes from
    the file the zygote writes when it reaps it."""

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
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class RankZygote:
    """One process that has imported the trainer and forks ranks from it
    (tests/trainer/rank_zygote.py): a rank starts in a fraction of a second
    instead of the ~4 CPU-seconds of its imports."""

    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)

    def fork(self, args: list[str], env: dict, stderr: Path) -> ForkedRank:
        exit_file = stderr.with_suffix(".exit")
        request = {"args": args, "env": env, "stderr": str(stderr), "exit": str(exit_file)}
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the rank zygote ended (exit {self.proc.wait()})"
        return ForkedRank(json.loads(line)["pid"], exit_file)

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]  # it kills the ranks still running
        self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def rank_zygote():
    zygote = RankZygote()
    yield zygote
    zygote.close()


@dataclass
class Ranks:
    """Processes of one launch and where they write."""

    procs: list[Union[subprocess.Popen, ForkedRank]]
    out: Path

    def wait(self, timeout: float = 120) -> list[dict]:
        """Wait for every rank; fail with its stderr when one fails; return results by rank."""
        for rank, proc in enumerate(self.procs):
            proc.wait(timeout=timeout)
            assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{self.stderr(rank)[-3000:]}"
        return [json.loads((self.out / f"rank{r}.json").read_text()) for r in range(len(self.procs))]

    def stderr(self, rank: int) -> str:
        return (self.out / f"rank{rank}.stderr").read_text()

    def events(self, rank: int, kind: Optional[str] = None) -> list[dict]:
        path = self.out / f"rank{rank}.events"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
        return [e for e in lines if kind is None or e["kind"] == kind]

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def launch_processes(out: Path, config: dict, plan: Optional[dict], world_size: int,
                     zygote: Optional[RankZygote] = None) -> Ranks:
    """Start ``world_size`` rank processes training ``config`` under ``plan``,
    writing into ``out``: forked by ``zygote``, or each a new Python."""
    spec = out / "spec.json"
    spec.write_text(json.dumps({"config": config, "plan": plan or {}}))
    port = free_port()
    procs: list[Union[subprocess.Popen, ForkedRank]] = []
    for rank in range(world_size):
        # stderr to a file, not a pipe: a full pipe would stall a rank mid-collective.
        stderr = out / f"rank{rank}.stderr"
        env = rank_env(rank, world_size, port)
        if zygote is not None:
            procs.append(zygote.fork([str(spec), str(out)], env, stderr))
            continue
        with stderr.open("w") as err:
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(spec), str(out)],
                                          env=env, stdout=subprocess.DEVNULL, stderr=err))
    return Ranks(procs, out)


@pytest.fixture(scope="module")
def launch_ranks(tmp_path_factory, rank_zygote):
    """``launch_ranks(config_dict, plan_dict, world_size=2) -> Ranks``: real
    processes training with gloo on 127.0.0.1."""
    launched: list[Ranks] = []

    def launch(config: dict, plan: Optional[dict] = None, world_size: int = 2) -> Ranks:
        ranks = launch_processes(tmp_path_factory.mktemp("ranks"), config, plan, world_size, rank_zygote)
        launched.append(ranks)
        return ranks

    yield launch
    for ranks in launched:
        ranks.kill_all()
