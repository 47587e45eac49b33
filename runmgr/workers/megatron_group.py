"""The ranks of a Megatron-style sub-run: one :mod:`megatron_node` actor per
node, each running the node's ``torchrun`` of the user's script.

Placed like the built-in trainer's ranks (runmgr/workers/placing.py), but a
node actor holds all its ranks' resources; a lineage's actors serve its next
sub-run too where they fit (runmgr/workers/megatron_nodes.py). The group never
decides anything: it starts what ``make_commands`` builds from the plan,
reports what the output says (runmgr/workers/megatron_output.py) and the
readings of the nodes' devices that the node actors drain with it, and stops
every process of every node on shutdown.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, Sequence

import ray
from ray.exceptions import RayActorError

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig
from runmgr.config.argv import flag_value
from runmgr.controller.group import GroupPoll, OutputLine, WorkerFailure, WorkerInfo
from runmgr.errors import ClusterError
from runmgr.megatron.silences import planned_silences
from runmgr.stacks import DUMP_TIMEOUT_S
from runmgr.watch.megatron_log import MegatronLogReader
from runmgr.workers.megatron_nodes import MegatronNodes
from runmgr.workers.megatron_output import OutputTranslator, TorchrunReader, node_failure
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

DRAIN_WAIT_S = 0.5
"""Beyond the poll's own wait: how long a node's drain may take to come back."""
STOP_MARGIN_S = 10.0
"""Beyond the stop grace: how long shutdown waits for the nodes to say they stopped."""
FAILURE_SETTLE_S = 3.0
"""After a node's torchrun failed, how long the other running nodes are given to report theirs in
the same poll, so that the root cause (a killed rank) wins over its echo (a survivor's broken
collective), whichever node's torchrun ended first: a torchrun looks at its ranks every 0.1 s
(``--monitor-interval``), then tears its node down before it exits."""


class NodeCommandLike(Protocol):
    """What ``runmgr.megatron.command.NodeCommand`` carries for one node."""

    node_rank: int
    argv: Sequence[str]
    env: Mapping[str, str]

    def masked(self) -> dict: ...


MakeCommands = Callable[[ResumePlan, str, int, int], Sequence[NodeCommandLike]]
"""``(plan, master address, master port, nodes) -> one command per node``, in node-rank order."""


class MegatronWorkerGroup:
    """One actor per node, each running the node's torchrun; implements
    :class:`runmgr.controller.group.WorkerGroup`."""

    def __init__(self, cluster: ClusterConfig, device_kind: str, nproc_per_node: int, make_commands: MakeCommands,
                 torchrun: TorchrunReader, start_timeout_s: float, lease_s: float,
                 checkpoint_dir: Optional[Path] = None, seq_length: Optional[int] = None,
                 admitted_node_ids: Optional[list[str]] = None, stop_grace_s: float = 10.0,
                 make_reader: Callable[[], MegatronLogReader] = MegatronLogReader,
                 settle_s: float = FAILURE_SETTLE_S, nodes: Optional[MegatronNodes] = None) -> None:
        """``make_commands``: the sub-run's node commands from its plan; ``torchrun``: reads
        torchrun's failure report and the tracker lines (runmgr.watch.torchrun);
        ``checkpoint_dir``: the job's ``--save``; ``seq_length``: its ``--seq-length``
        (None: steps report 0 tokens); ``stop_grace_s``: SIGTERM to SIGKILL on shutdown;
        ``settle_s``: after a failed node, how long a poll waits for the other nodes' ends;
        ``nodes``: the lineage's node actors, kept across its sub-runs (None: the group's own,
        ended at its shutdown, which read no device)."""
        self.cluster = cluster
        self.nproc_per_node = nproc_per_node
        self.make_commands = make_commands
        self.torchrun = torchrun
        self.start_timeout_s = start_timeout_s
        self.checkpoint_dir = checkpoint_dir
        self.seq_length = seq_length
        self.stop_grace_s = stop_grace_s
        self.make_reader = make_reader
        self.settle_s = settle_s
        self._owns_nodes = nodes is None
        self.nodes = nodes or MegatronNodes(cluster, device_kind, nproc_per_node, start_timeout_s, lease_s,
                                            admitted_node_ids)
        self._nodes: list = []
        self._infos: list[WorkerInfo] = []
        self._running: set[int] = set()
        self._drains: dict = {}
        self._first_poll = GroupPoll()
        self._translator: Optional[OutputTranslator] = None

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self._infos)

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        """Place the nodes, start their torchruns; one WorkerInfo per rank (its own process).
        ``config`` gives only the ranks of a data-parallel replica: the user's arguments
        carry the training settings."""
        ray_cluster.check_head()  # placing nodes needs the head: without it Ray waits until it ends the driver
        world = config.world_size_of(plan.data_parallel_size) if plan.data_parallel_size else self.cluster.num_workers
        if world % self.nproc_per_node:
            raise ClusterError(f"{world} ranks do not fill nodes of megatron.nproc_per_node="
                               f"{self.nproc_per_node}; use a world size that is a multiple of it")
        nnodes = world // self.nproc_per_node
        self._nodes, described = self.nodes.for_subrun(nnodes, plan.avoid_nodes)
        try:
            self._infos = self._launch(plan, nnodes, described)
        except BaseException:
            self.shutdown()  # no node left running a half-started sub-run ...
            self.nodes.close()  # ... nor an actor in an unknown state
            raise
        self._running = set(range(nnodes))
        now = time.time()
        argv = self._first_poll.commands[0]["argv"] if self._first_poll.commands else []
        silences = planned_silences(argv, plan.subrun, now)
        self._translator = OutputTranslator(plan, range(world), self.make_reader(), self.checkpoint_dir,
                                            self.seq_length, start_step=int(flag_value(argv, "--ckpt-step") or 0),
                                            silences=silences)
        self._translator.started(self._first_poll, now)
        return self.workers

    def _launch(self, plan: ResumePlan, nnodes: int, described: list[dict]) -> list[WorkerInfo]:
        port = ray.get(self._nodes[0].reserve_port.remote())
        commands = list(self.make_commands(plan, described[0]["node_ip"], port, nnodes))
        self._first_poll.commands = [command.masked() for command in commands]
        torchrun_pids = ray.get([node.launch.remote(tuple(command.argv), dict(command.env), os.getcwd())
                                 for node, command in zip(self._nodes, commands)])
        found = ray_cluster.get_while_head_lives(
            [node.rank_pids.remote(self.nproc_per_node, self.start_timeout_s) for node in self._nodes],
            self.start_timeout_s + DRAIN_WAIT_S)
        infos = []
        for node, (where, pids, torchrun_pid) in enumerate(zip(described, found, torchrun_pids)):
            for rank in self._ranks_of(node):
                # A rank not found (its torchrun already ended) is reached through its torchrun.
                infos.append(WorkerInfo(rank, pids.get(rank, torchrun_pid), where["node_id"], where["node_ip"]))
        return infos

    def _ranks_of(self, node: int) -> list[int]:
        return list(range(node * self.nproc_per_node, (node + 1) * self.nproc_per_node))

    def poll(self, timeout_s: float) -> GroupPoll:
        """What the nodes printed since the last poll, and the nodes whose torchrun ended."""
        result, self._first_poll = self._first_poll, GroupPoll()
        self._drain_running(timeout_s)
        self._collect(result)
        deadline = time.monotonic() + self.settle_s
        while result.failures and self._running and time.monotonic() < deadline:
            self._drain_running(min(timeout_s, deadline - time.monotonic()))
            self._collect(result)
        return result

    def _drain_running(self, wait_s: float) -> None:
        """Ask each running node for what it printed (a node asked before keeps its request) and
        wait up to ``wait_s`` for the answers."""
        for node in self._running:
            if node not in self._drains:
                self._drains[node] = self._nodes[node].drain.remote(wait_s)
        if self._drains:
            ray_cluster.check_head()
            refs = list(self._drains.values())
            ray.wait(refs, num_returns=len(refs), timeout=wait_s + DRAIN_WAIT_S)

    def _collect(self, result: GroupPoll) -> None:
        """Take the drains that came back; a node that does not answer keeps its request
        pending for the next poll, so one wedged node never stalls the driver."""
        refs = list(self._drains.values())
        ready_set = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        lines: list[tuple[float, int, str]] = []
        ended = []
        for node, ref in list(self._drains.items()):
            if ref not in ready_set:
                continue
            del self._drains[node]
            try:
                drained = ray.get(ref)
            except RayActorError as exc:
                self._running.discard(node)
                rank = self._ranks_of(node)[0]
                result.failures.append(WorkerFailure(rank, "died", f"the actor of node {node} died: "
                                                     f"{str(exc).strip()[:500]}", self._info(rank), time.time()))
                continue
            lines += [(at, node, text) for at, text in drained["lines"]]
            result.devices.extend(drained["devices"])  # a node's devices belong to no sub-run
            if drained["exit"] is not None:
                ended.append((node, drained))
        assert self._translator is not None
        lines.sort(key=lambda line: line[0])
        self._translator.lines([(at, text) for at, _, text in lines], result)
        result.output += [OutputLine(node, text) for _, node, text in lines]
        result.devices.sort(key=lambda reading: reading.time)
        for node, drained in ended:
            self._ended(node, drained, result)

    def _ended(self, node: int, drained: dict, result: GroupPoll) -> None:
        self._running.discard(node)
        if drained["exit"] == 0:
            result.finished_ranks += self._ranks_of(node)
            assert self._translator is not None
            self._translator.finished(self._ranks_of(node))
            return
        result.failures.append(node_failure(self._ranks_of(node), drained["exit"], drained["tail"],
                                            drained["tracker"], self.torchrun, self._info, time.time()))

    def _info(self, rank: int) -> Optional[WorkerInfo]:
        return self._infos[rank] if rank < len(self._infos) else None

    def dump_stacks(self, out_dir: Path) -> list[Path]:
        """Every rank's stacks, dumped with py-spy by its node, one file per rank in ``out_dir``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        refs = [node.dump_stacks.remote() for node in self._nodes]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=DUMP_TIMEOUT_S * self.nproc_per_node + DRAIN_WAIT_S)
        written = []
        for node, ref in enumerate(refs):
            try:
                texts = ray.get(ref) if ref in ready else {}
            except RayActorError as exc:
                texts = {rank: f"the actor of node {node} died: {exc}\n" for rank in self._ranks_of(node)}
            for rank in self._ranks_of(node):
                target = out_dir / f"rank{rank}.txt"
                target.write_text(texts.get(rank, f"rank {rank}: node {node} gave no stack (not answering, "
                                                  f"or the rank's process was never found)\n"))
                written.append(target)
        return written

    def shutdown(self) -> None:
        """Stop every process of every node (SIGTERM, SIGKILL after the grace); the actors too,
        unless they are the lineage's kept ones. A node that does not say it stopped in time
        takes the kept actors with it: the next sub-run places new ones."""
        stops = [node.stop.remote(self.stop_grace_s) for node in self._nodes]
        stopped = True
        if stops:
            ready, _ = ray.wait(stops, num_returns=len(stops), timeout=self.stop_grace_s + STOP_MARGIN_S)
            stopped = len(ready) == len(stops)
        self._nodes, self._drains, self._running = [], {}, set()
        if self._owns_nodes or not stopped:
            self.nodes.close()
