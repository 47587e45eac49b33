"""Warm recovery in the trainer: rank r of a 2-rank run is killed (SIGKILL, at a step's
start, as a memory snapshot begins, or halfway through copying one: after the model's
tensors, before the optimizer's); the survivor keeps its process, re-forms the group
on a new rendezvous with a ready spare that receives the lost rank's state from the
survivor's memory, and the run ends with the uninterrupted run's losses, bit for bit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, free_port, rank_env
from tests.trainer.parallel.conftest import tiny_config

STEPS = 30
WORKER = Path(__file__).with_name("warm_worker.py")


def config(save_dir: Path) -> dict:
    return tiny_config(save_dir, training={"train_iters": STEPS}, checkpoint={"memory_interval": 1,
                                                                               "save_interval": 10})


def start(rank_forkserver, out: Path, role: str, rank: int = 0, port: int = 0):
    env = rank_env(rank, 2, port) if role == "rank" else rank_env(0, 1, 0)
    name = f"rank{rank}" if role == "rank" else "spare"
    return rank_forkserver.start([str(out / "spec.json"), str(out), role], script=str(WORKER), cwd=str(REPO),
                                 env=env, stderr=out / f"{name}.stderr")


def wait_for(path: Path, proc, timeout_s: float = 300) -> None:
    """Until ``path`` exists; a process that exits meanwhile fails the test with its stderr."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"exited {proc.returncode} before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} in {timeout_s} s"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, rank_forkserver) -> list[float]:
    out = tmp_path_factory.mktemp("reference")
    (out / "spec.json").write_text(json.dumps({"config": config(out / "checkpoints")}))
    port = free_port()
    procs = [start(rank_forkserver, out, "rank", rank, port) for rank in range(2)]
    for rank, proc in enumerate(procs):
        assert proc.wait(timeout=600) == 0, (out / f"rank{rank}.stderr").read_text()[-3000:]
    return json.loads((out / "rank0.json").read_text())["losses"]


@pytest.mark.parametrize("victim, phase, step", [(1, "step", 17), (0, "snapshot", 23), (1, "inside_snapshot", 21)])
def test_a_killed_rank_is_replaced_warm_and_the_losses_match_the_unbroken_run(
        tmp_path, rank_forkserver, uninterrupted, victim, phase, step):
    kill = {"rank": victim, "phase": phase, "step": step}
    (tmp_path / "spec.json").write_text(json.dumps({"config": config(tmp_path / "checkpoints"), "kill": kill}))
    port = free_port()
    ranks = [start(rank_forkserver, tmp_path, "rank", rank, port) for rank in range(2)]
    spare = start(rank_forkserver, tmp_path, "spare")
    survivor = 1 - victim
    assert ranks[victim].wait(timeout=600) == -9
    wait_for(tmp_path / f"waiting.rank{survivor}", ranks[survivor])
    asked = json.loads((tmp_path / f"waiting.rank{survivor}").read_text())
    assert asked["newest"] in (step - 1, step) and "Connection" in asked["error"]
    wait_for(tmp_path / "waiting.spare", spare)  # built its model while the run trained
    (tmp_path / "rejoin.json").write_text(json.dumps({
        "port": free_port(), "world_size": 2, "plan": {"subrun": "0.01"}, "donors": {str(victim): survivor},
        "replace": victim}))
    assert ranks[survivor].wait(timeout=600) == 0, (tmp_path / f"rank{survivor}.stderr").read_text()[-3000:]
    assert spare.wait(timeout=600) == 0, (tmp_path / "spare.stderr").read_text()[-3000:]
    kept = json.loads((tmp_path / f"rank{survivor}.json").read_text())["losses"]
    replaced = json.loads((tmp_path / "spare.json").read_text())["losses"]
    assert kept == replaced == uninterrupted  # bit for bit: the same floats, every step
    # The re-formed group reported under the new sub-run from the step after the agreed snapshot: the
    # step the victim died in (at a step's start), or the next one (its snapshot's step was complete).
    reporter = tmp_path / ("spare.events" if victim == 0 else "rank0.events")
    steps = [json.loads(line) for line in reporter.read_text().splitlines() if '"kind": "step"' in line]
    resumed = [s["step"] for s in steps if s["subrun"] == "0.01"]
    assert resumed[0] == (step if phase == "step" else step + 1) and resumed[-1] == STEPS
    if phase == "inside_snapshot":  # the victim's own snapshot of the step was never finished
        assert asked["newest"] == step
