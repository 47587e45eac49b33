"""Fixtures of the trainer's tests: launching real ranks as processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import pytest

from runmgr.ports import rendezvous_port
from tests.forkserver import ForkedProcess, ForkServer

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rank_worker.py")


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


def rank_env(rank: int, world_size: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


RANK_PRELOAD = ["trainer.cli", "trainer.distributed", "trainer.loop", "trainer.plan", "trainer.parallel.engine",
                "torch.distributed.checkpoint", "torch.distributed.tensor.parallel", "torch.distributed.pipelining",
                "torch.distributed.fsdp"]
"""What a rank imports (rank_worker.py, and on first use): about 4 CPU-seconds, paid once."""


@pytest.fixture(scope="session")
def rank_forkserver():
    """Forks rank processes (tests/forkserver.py): a rank starts in a fraction of a second.
    Started with the ranks' ``OMP_NUM_THREADS=1``, which OpenMP reads when torch loads."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    server = ForkServer(RANK_PRELOAD, env)
    yield server
    server.close()


@dataclass
class Ranks:
    """Processes of one launch and where they write."""

    procs: list[Union[subprocess.Popen, ForkedProcess]]
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
                     forkserver: Optional[ForkServer] = None, own_peak: bool = False) -> Ranks:
    """Start ``world_size`` rank processes training ``config`` under ``plan``,
    writing into ``out``: forked by ``forkserver``, or each a new Python. ``own_peak``:
    each rank resets its peak resident set before training (rank_worker.py)."""
    spec = out / "spec.json"
    spec.write_text(json.dumps({"config": config, "plan": plan or {}, "own_peak": own_peak}))
    port = free_port()
    procs: list[Union[subprocess.Popen, ForkedProcess]] = []
    for rank in range(world_size):
        # stderr to a file, not a pipe: a full pipe would stall a rank mid-collective.
        stderr = out / f"rank{rank}.stderr"
        env = rank_env(rank, world_size, port)
        if forkserver is not None:
            procs.append(forkserver.start([str(spec), str(out)], script=str(WORKER), cwd=str(REPO), env=env,
                                          stderr=stderr))
            continue
        with stderr.open("w") as err:
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(spec), str(out)],
                                          env=env, stdout=subprocess.DEVNULL, stderr=err))
    return Ranks(procs, out)


@pytest.fixture(scope="module")
def launch_ranks(tmp_path_factory, rank_forkserver):
    """``launch_ranks(config_dict, plan_dict, world_size=2) -> Ranks``: real
    processes training with gloo on 127.0.0.1."""
    launched: list[Ranks] = []

    def launch(config: dict, plan: Optional[dict] = None, world_size: int = 2) -> Ranks:
        ranks = launch_processes(tmp_path_factory.mktemp("ranks"), config, plan, world_size, rank_forkserver)
        launched.append(ranks)
        return ranks

    yield launch
    for ranks in launched:
        ranks.kill_all()
