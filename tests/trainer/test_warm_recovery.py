"""Warm recovery in the trainer: a rank is killed (SIGKILL, at a step's start, as its
gradient all-reduce begins, as a memory snapshot begins, halfway through copying one:
after the model's tensors, before the optimizer's, or at a random moment of a step: a
delay drawn by the test, wherever it lands); the survivors keep their processes,
re-form the group on a new rendezvous with a ready spare that receives the lost rank's state
from a peer's memory, and the run ends with the uninterrupted run's losses, bit for bit.

In plain data parallel any replica's live state serves, and no snapshot is taken
(trainer/live.py). Under the other layouts (ZeRO-1 and FSDP2 shards, tensor- and
pipeline-parallel parts) only its buddy holds the lost rank's state: the rank after it keeps
a copy of its snapshot, and the group builds its model anew on a new mesh."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.trainer.conftest import REPO, free_port, rank_env
from tests.trainer.parallel.conftest import tiny_config
from tests.trainer.warm_worker import write_whole

pytestmark = pytest.mark.slow  # several ranks training for minutes: run first under xdist

WORKER = Path(__file__).with_name("warm_worker.py")


@dataclass(frozen=True)
class Layout:
    """A layout the warm recovery is checked under, and the run it trains."""

    world: int
    """Ranks."""
    parallel: dict
    """The config's ``parallel`` section."""
    steps: int
    """Steps the run trains: a few past the latest kill of the layout's cases."""
    batch: int = 16
    """The global batch: whole micro-batches of 4 per replica."""


LAYOUTS = {
    # Each kill falls at step 5, two steps after the disk checkpoint of step 3 (a resume from disk
    # would report from step 4, not the kill's step), and a step or two before the run's end (a
    # random kill lands in step 5 or at step 6's start); what follows the re-formed group's first
    # steps adds nothing that longer runs (30 steps, kills past step 20; then 10-12, kills at 7-8)
    # showed, at two to five times the CPU.
    "dp2": Layout(2, {}, steps=7),
    "dp3": Layout(3, {}, steps=6, batch=12),
    "zero1": Layout(2, {"use_distributed_optimizer": True}, steps=7),
    "fsdp2": Layout(2, {"use_torch_fsdp2": True}, steps=6),
    # Tensor parallel steps cost ~10x a data-parallel one (DTensor's dispatch per operation, on 2
    # cores), so these runs take one micro-batch per replica a step: gradient accumulation across
    # a warm recovery is what the data-parallel and pipeline layouts check.
    "tp2": Layout(2, {"tensor_model_parallel_size": 2, "sequence_parallel": True}, steps=6, batch=4),
    "pp2": Layout(2, {"pipeline_model_parallel_size": 2}, steps=6),  # 1F1B: 4 micro-batches a step
    "fsdp2xtp2": Layout(4, {"use_torch_fsdp2": True, "tensor_model_parallel_size": 2}, steps=6, batch=8),
}
"""Layout name -> its ranks, settings and run."""
SAVE_INTERVAL = 3
"""Steps between disk checkpoints: every kill is two steps past one (and the re-formed group
saves one at step 6)."""
KILL_AT = 5
"""The step every case's kill falls in."""


SMALL_MODEL = {"num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "seq_length": 16,
               "max_position_embeddings": 16}
"""Half the parallel tests' tiny model in depth, width and sequence: bit-for-bit equality shows at
any size; 2 layers still give each pipeline stage one, and 4 heads of 8 in 2 key/value groups
still split whole over tensor-parallel 2. A tensor-parallel step's cost is DTensor's dispatch per
operation, so half the layers is half of it."""


def config(save_dir: Optional[Path], layout: str, memory_interval: int = 1) -> dict:
    """The layout's run; ``memory_interval`` 0 and no ``save_dir``: no warm snapshots and no disk
    checkpoints (the unbroken reference, which thereby also shows that taking them changes no
    loss; its two saves were a third of a rank's CPU after its start)."""
    run = LAYOUTS[layout]
    return tiny_config(save_dir, model=SMALL_MODEL,
                       training={"train_iters": run.steps, "global_batch_size": run.batch},
                       parallel=run.parallel,
                       checkpoint={"memory_interval": memory_interval, "save_interval": SAVE_INTERVAL})


def start(rank_forkserver, out: Path, role: str, rank: int = 0, world: int = 2, port: int = 0):
    env = rank_env(rank, world, port) if role == "rank" else rank_env(0, 1, 0)
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
def uninterrupted(tmp_path_factory, rank_forkserver):
    """``uninterrupted(layout) -> losses``: the unbroken run's losses at a layout (run once)."""
    runs: dict[str, list[float]] = {}

    def losses(layout: str) -> list[float]:
        if layout not in runs:
            out = tmp_path_factory.mktemp(f"reference-{layout}")
            (out / "spec.json").write_text(json.dumps({"config": config(None, layout, 0)}))
            world, port = LAYOUTS[layout].world, free_port()
            procs = [start(rank_forkserver, out, "rank", rank, world, port) for rank in range(world)]
            for rank, proc in enumerate(procs):
                assert proc.wait(timeout=600) == 0, (out / f"rank{rank}.stderr").read_text()[-3000:]
            runs[layout] = json.loads((out / "rank0.json").read_text())["losses"]
        return runs[layout]

    return losses


@pytest.mark.parametrize("layout, victim, phase", [
    ("dp2", 0, "reduce"), ("dp3", 1, "reduce"), ("dp2", 1, "random"),
    ("zero1", 1, "inside_snapshot"), ("zero1", 0, "random"), ("fsdp2", 0, "step"),
    ("tp2", 0, "snapshot"), ("pp2", 1, "step"), ("fsdp2xtp2", 2, "step"),
])
def test_a_killed_rank_is_replaced_warm_and_the_losses_match_the_unbroken_run(
        tmp_path, rank_forkserver, uninterrupted, layout, victim, phase):
    world, last, step = LAYOUTS[layout].world, LAYOUTS[layout].steps, KILL_AT
    buddies = not layout.startswith("dp")  # the lost rank's state is only in its buddy's memory: the next rank's
    donor = (victim + 1) % world  # a replica in plain data parallel, the buddy otherwise
    kill = {"rank": victim, "phase": phase, "step": step}
    if phase == "random":  # anywhere in the step or the snapshot after it: a share of the step before's time
        kill["share"] = random.uniform(0.0, 1.0)
    (tmp_path / "spec.json").write_text(json.dumps({"config": config(tmp_path / "checkpoints", layout), "kill": kill}))
    port = free_port()
    ranks = [start(rank_forkserver, tmp_path, "rank", rank, world, port) for rank in range(world)]
    spare = start(rank_forkserver, tmp_path, "spare")
    survivors = [rank for rank in range(world) if rank != victim]
    assert ranks[victim].wait(timeout=600) == -9
    for survivor in survivors:
        wait_for(tmp_path / f"waiting.rank{survivor}", ranks[survivor])
    asked = json.loads((tmp_path / f"waiting.rank{donor}").read_text())
    if phase != "random":  # a replica's live state stands at the step before the one whose collective failed
        assert asked["newest"] in ((step - 1,) if not buddies else (step - 1, step)) and "Connection" in asked["error"]
    wait_for(tmp_path / "waiting.spare", spare)  # built its model (or paid its imports) while the run trained
    write_whole(tmp_path / "rejoin.json", {  # the ranks poll for it: it appears whole
        "port": free_port(), "world_size": world, "plan": {"subrun": "0.01"}, "donors": {str(victim): donor},
        "replace": victim})
    for survivor in survivors:
        assert ranks[survivor].wait(timeout=600) == 0, (tmp_path / f"rank{survivor}.stderr").read_text()[-3000:]
    assert spare.wait(timeout=600) == 0, (tmp_path / "spare.stderr").read_text()[-3000:]
    reference = uninterrupted(layout)
    kept = json.loads((tmp_path / f"rank{survivors[0]}.json").read_text())["losses"]
    replaced = json.loads((tmp_path / "spare.json").read_text())["losses"]
    assert kept == replaced == reference, kill  # bit for bit: the same floats, every step
    # The re-formed group reported under the new sub-run from the step the victim died in: a
    # replica's live state stands at the step before it; a buddy's copy of the victim's snapshot of
    # that step arrives only after the snapshot is taken, and the step's own may be unfinished.
    reporter = tmp_path / ("spare.events" if victim == 0 else "rank0.events")
    steps = [json.loads(line) for line in reporter.read_text().splitlines() if '"kind": "step"' in line]
    resumed = [s["step"] for s in steps if s["subrun"] == "0.01"]
    assert resumed == list(range(resumed[0], last + 1)), kill
    assert resumed[0] == step if phase != "random" else resumed[0] >= step, kill
    if phase == "inside_snapshot":  # the victim's own snapshot of the step was never finished
        assert asked["newest"] == step
