"""What the Megatron worker-group tests share: a stand-in for the node command
builder (runmgr.megatron.command, built on another branch), the group over
the fake script, and a poll loop that gathers what the group reports."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from runmgr.config.schema import ClusterConfig
from runmgr.controller.group import GroupPoll
from runmgr.workers.megatron_group import MegatronWorkerGroup
from runmgr.workers.megatron_nodes import MegatronNodes
from runmgr.watch import torchrun
from trainer.plan import ResumePlan

SCRIPT = Path(__file__).parent / "megatron_scripts" / "fake_megatron.py"
SAFETY_S = 90.0
"""Only against a test that would otherwise never end; no assertion depends on it."""


@dataclass(frozen=True)
class StandInCommand:
    node_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]

    def masked(self) -> dict:
        return {"node_rank": self.node_rank, "argv": list(self.argv), "env": dict(self.env)}


def torchrun_commands(script_args: Sequence[str], nproc: int):
    """``make_commands`` that starts the fake script under torchrun on every node."""
    def make(plan: ResumePlan, master_addr: str, master_port: int, nnodes: int) -> list[StandInCommand]:
        return [StandInCommand(node, (sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
                                      "--node-rank", str(node), "--nproc-per-node", str(nproc),
                                      "--master-addr", master_addr, "--master-port", str(master_port),
                                      "--max-restarts", "0", str(SCRIPT), *script_args),
                               {"RUNMGR_TEST_SUBRUN": plan.subrun})
                for node in range(nnodes)]
    return make


def make_group(script_args: Sequence[str], nodes: int = 1, nproc: int = 2, kept: MegatronNodes | None = None,
               **kwargs) -> MegatronWorkerGroup:
    """The group over the fake script on ``nodes`` nodes of ``nproc`` ranks; ``kept``: the
    lineage's node actors it takes (None: its own)."""
    cluster = ClusterConfig(num_workers=nodes * nproc, cpus_per_worker=0.25)
    return MegatronWorkerGroup(cluster, "cpu", nproc, torchrun_commands(script_args, nproc), torchrun,
                               start_timeout_s=60.0, lease_s=30.0, stop_grace_s=5.0, nodes=kept, **kwargs)


def kept_nodes(nproc: int) -> MegatronNodes:
    """Node actors kept across sub-runs, as a launch's runner keeps them."""
    return MegatronNodes(ClusterConfig(cpus_per_worker=0.25), "cpu", nproc, start_timeout_s=60.0, lease_s=30.0)


@dataclass
class Seen:
    """Everything the polls returned, in order."""

    polls: list[GroupPoll] = field(default_factory=list)

    def nonempty(self) -> list[GroupPoll]:
        return [poll for poll in self.polls if poll != GroupPoll()]

    def all(self, name: str) -> list:
        return [item for poll in self.polls for item in getattr(poll, name)]


def poll_until(group: MegatronWorkerGroup, done: Callable[[Seen], bool], seen: Seen | None = None) -> Seen:
    seen = seen if seen is not None else Seen()
    deadline = time.monotonic() + SAFETY_S
    while not done(seen):
        assert time.monotonic() < deadline, f"the group never reported it; it reported {seen.nonempty()}"
        seen.polls.append(group.poll(0.2))
    return seen
