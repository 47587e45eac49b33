"""A real node agent: one Ray actor per node that forks the node's trainer ranks, hears them,
sums them up and pushes one report per interval to the driver's inbox.

:class:`NodeAgent` is what :class:`runmgr.workers.agent_group.AgentWorkerGroup` drives on a
real cluster, as the scale harness's simulated agents (runmgr/scale/agent_hosts.py) are on a
simulated one: the ranks are forked from the node's fork server
(runmgr/agents/rank_processes.py), their reports summed up by the code the simulation runs
(runmgr/agents/summary.py). The driver's side, runmgr/workers/ray_node_agents.py's
:class:`RayNodeAgents`, places the ranks as the per-rank group does
(one bundle per rank) and starts one agent on each node that got some, holding the resources of
all the node's ranks: on accelerators, their devices, one rank's share to each forked rank.

The agents live across sub-runs: a sub-run's stop ends its ranks and keeps the agent, whose
fork server has the trainer imported, for the next one on the same nodes; ``close`` ends them.

The agent holds its ranks' driver lease (runmgr/workers/lease.py), as a Megatron node's actor
does for its torchrun: every call of the driver renews it, and so does each push's answer (how
long the driver has not drained the inbox). Once the driver is gone the agent stops its ranks and
ends; before that, each rank checks its driver itself before it writes or commits a checkpoint
(:class:`~runmgr.workers.lease.CheckDriverBeforeCommit`). It dumps its ranks' stacks with py-spy
where they run. It reads its node's devices itself (the mid-run device poll,
runmgr/workers/devicepoll.py's :class:`NodeDevicePoll`, in a thread) and puts the readings in its
next report.

Every built-in trainer's launch runs its ranks under agents, warm or not, on any device kind
(runmgr/runners.py). Warm, the ranks' warm link runs over their pipe (runmgr/agents/warm_link.py),
spares are forked here (``start_spares``) and a recovery renames and answers them (``regroup``).
On accelerators each forked rank or spare holds a device slice of its own for its process's life
(runmgr/agents/device_slices.py).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Any, Optional, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from runmgr.agents.cadence import PushCadence
from runmgr.agents.device_slices import DeviceSlices, NoFreeDevices, slices_for
from runmgr.agents.rank_processes import PRELOAD, RankProcesses, RankStart, WrapReporter
from runmgr.agents.rank_processes import spare_key
from runmgr.agents.report import NodeReport, RankEnd, SpareNews
from runmgr.agents.snapshots import SnapshotLedger
from runmgr.agents.warm_link import WAITING, WarmRun
from runmgr.agents.summary import NodeSummariser
from runmgr.controller.group import WorkerInfo
from runmgr.placement import accelerator_resource
from runmgr.ports import rendezvous_port
from runmgr.stacks import dump_pid, find_py_spy, worker_header
from runmgr.workers.devicepoll import DevicePollSettings, HeldNodePoll
from runmgr.workers.lease import (
    CheckDriverBeforeCommit, DriverIdentity, DriverLease, SelfStop, ray_job_alive, stopped_itself,
)

PUSH_INTERVAL_S = 0.5
"""How often an agent pushes its node's report (at once when a rank ended)."""
STOP_GRACE_S = 5.0
"""SIGTERM to SIGKILL when the group stops a node's ranks."""
STOP_MARGIN_S = 10.0
"""Beyond the grace: how long a node's stop may take before its agent is killed instead."""
LOST_DRIVER_PUSH_S = 2.0
"""How long an agent whose driver fell silent tries to tell it why its ranks end."""
AGENT_PRELOAD = (*PRELOAD, "ray")
"""In a Ray actor, ``multiprocessing`` has each forked child run the module level of Ray's
worker script (the actor process's ``__main__``) before its rank: with Ray imported by the
server, that costs the child nothing."""


class NodeAgent:
    """The agent of one node: its ranks, forked; one :class:`NodeReport` pushed per interval."""

    def __init__(self, node: str, push_interval_s: float = PUSH_INTERVAL_S, lease_s: float = float("inf"),
                 driver: Optional[DriverIdentity] = None, beat_interval_s: Optional[float] = None,
                 device_kind: str = "cpu", devices_per_rank: int = 0, threads_per_rank: Optional[int] = None,
                 device_poll: Optional[DevicePollSettings] = None) -> None:
        """``lease_s``: how long the driver may be silent before the agent asks whether it lives;
        ``driver``: who drives this node (None: the lease and Ray's word decide);
        ``beat_interval_s``: how often a beat alone is pushed (:mod:`runmgr.agents.cadence`;
        None: every push interval); ``device_kind`` and ``devices_per_rank``: each forked process's
        slice of the devices Ray gave this agent (:meth:`_fork`); ``threads_per_rank``:
        each rank's ``OMP_NUM_THREADS`` (None: what Ray set for this actor); ``device_poll``: how
        this node's devices are read (None: they are not), the readings pushed with the reports."""
        self.node = node
        self.device_kind = device_kind
        self.devices_per_rank = devices_per_rank
        if threads_per_rank is not None:
            # The agent holds the CPUs of all its node's ranks, and Ray sized this process's thread
            # count to them; each rank gets a per-rank actor's share. Set before the fork server
            # starts: its OpenMP reads the variable as torch loads, and the ranks inherit that.
            os.environ["OMP_NUM_THREADS"] = str(threads_per_rank)
        self.push_interval_s = push_interval_s
        self.beat_interval_s = push_interval_s if beat_interval_s is None else beat_interval_s
        self.driver = driver
        self.processes = RankProcesses(preload=AGENT_PRELOAD)
        self.lease = DriverLease(lease_s, driver, job_alive=ray_job_alive)
        # Its ``idle`` stays set: a lost driver stops the ranks at once (they cannot be told to end
        # at their next beat), after telling a driver that may only be silent why.
        self.self_stop = SelfStop(self.lease, 0, exit=self._stop_then_exit)
        self._serving = threading.Lock()
        """Held by a sub-run's loop: the next sub-run's ranks start once the last one's loop ended."""
        self._stop = threading.Event()
        """The current sub-run's: set when the group stops the node."""
        self._infos: list[WorkerInfo] = []
        self._started = threading.Event()
        self._summary: Optional[NodeSummariser] = None
        self._inbox: Any = None
        self._warm: Optional[WarmRun] = None
        self._wraps: tuple = ()
        self._spare_start: Any = None
        """The current sub-run's config, plan, world and rendezvous, for its spares."""
        self._spares_started = 0
        self._slices: Optional[DeviceSlices] = None  # who holds which devices (None on CPU)
        self._forking = threading.Lock()  # a slice's take and hold are one step (spares fork on another thread)
        self._where = ("", "")
        """This node's id and address."""
        threading.Thread(target=self.self_stop.watch, name="driver-lease", daemon=True).start()
        self._device_poll = HeldNodePoll(node, device_poll) if device_poll is not None else None
        """This node's device readings, kept until a report takes them (between sub-runs too)."""

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free TCP port on it for the ranks' process groups."""
        self.lease.renew()
        return ray.util.get_node_ip_address(), rendezvous_port()

    def run(self, ranks: Sequence[int], world: int, master: tuple[str, int], config: Any, plan: Any,
            rank_nodes: Optional[dict[int, str]], inbox: Any, wrap_reporter: Optional[WrapReporter] = None,
            warm: Optional[WarmRun] = None) -> None:
        """Fork the node's ranks of one sub-run, then push their news until every rank ended or
        the group stopped the node. Called again for each sub-run the agent serves.
        ``wrap_reporter``: what every rank's reports pass through (chaos's pauses); ``warm``: the
        ranks train with a warm link and the node may hold spares (:meth:`start_spares`): it
        serves until the group stops it, as a rank may be recovered, or a spare started, later."""
        self.lease.renew()
        node_id, address = self._here()
        stop = threading.Event()
        wraps = (CheckDriverBeforeCommit(self.driver),) if self.driver is not None else ()
        wraps += (wrap_reporter,) if wrap_reporter is not None else ()
        with self._serving:
            self._stop, self._infos, self._inbox, self._warm = stop, [], inbox, warm
            self._wraps, self._spare_start, self._where = wraps, (config, plan, world, master), (node_id, address)
            failed = self._fork_ranks(ranks, world, master, config, plan, warm)
            ledger = SnapshotLedger(warm.live) if warm is not None else None
            self._summary = NodeSummariser(self.node, plan.subrun, ranks, rank_nodes, ledger)
            self._started.set()
            self._serve(self._summary, stop, inbox, warm is not None, failed)

    def _fork_ranks(self, ranks: Sequence[int], world: int, master: tuple[str, int], config: Any, plan: Any,
                    warm: Optional[WarmRun]) -> list[RankEnd]:
        """Fork the sub-run's ranks of this node; the ends of those that could not start (too few
        device ids for them: each rank's own words reach the driver, not a start timeout)."""
        node_id, address = self._where
        failed = []
        offset = warm.buddy_offset if warm is not None else 1
        for local_index, rank in enumerate(ranks):
            start = RankStart(config, plan, rank, world, local_index, *master, wraps=self._wraps,
                              warm=warm is not None, buddy_offset=offset)
            try:
                pid = self._fork(start, f"rank {rank}")
            except NoFreeDevices as exc:
                failed.append(RankEnd(rank, "error", f"rank {rank} could not start: {exc}", time.time()))
                pid = 0
            self._infos.append(WorkerInfo(rank, pid, node_id, address))
        return failed

    # What the agent asks Ray about itself, and its push: a test's in-process agent replaces these.
    def _here(self) -> tuple[str, str]:
        """This node's Ray id and address."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def _device_ids(self, resource: str) -> list[str]:
        return list(ray.get_runtime_context().get_accelerator_ids().get(resource, []))

    def _push(self, inbox: Any, reports: list[NodeReport]) -> float:
        """Push ``reports`` to the driver's inbox; how long the driver has not drained it."""
        return ray.get(inbox.push.remote(reports))

    def _fork(self, start: RankStart, what: str) -> int:
        """Fork ``start`` (``what``: ``rank 3``, ``a warm spare``); its pid. On accelerators its
        process holds a free slice of this agent's devices for its life, whatever rank it is named
        later; :class:`NoFreeDevices` in this node's words when every slice is held."""
        with self._forking:
            resource = accelerator_resource(self.device_kind)
            if self._slices is None and resource is not None:  # of the ids Ray gave this agent
                ids = self._device_ids(resource)
                self._slices = slices_for(self.node, self.device_kind, ids, self.devices_per_rank)
            slices = self._slices
            if slices is None:
                return self.processes.start(start)
            index = slices.take(self.processes.live_pids(), what)
            # A process that sees only its own devices computes on the first of them, as a
            # per-rank actor does (runmgr/workers/actor.py: local rank 0).
            pid = self.processes.start(replace(start, env=slices.env(index), local_rank=0))
            slices.hold(index, pid)
            return pid

    def _serve(self, summary: NodeSummariser, stop: threading.Event, inbox: Any, warm: bool,
               failed: Sequence[RankEnd] = ()) -> None:
        """Push the node's news until its ranks ended (warm: until stopped), ``failed`` ends first."""
        cadence = PushCadence(self.push_interval_s, self.beat_interval_s)
        while not summary.done or (warm and not stop.is_set()):
            # At once when a rank ended (or could not start).
            ends = [*failed, *self.processes.ended(wait_s=0.0 if failed else self.push_interval_s)]
            failed = ()
            if not ends and not self.processes.running():
                stop.wait(self.push_interval_s)  # a warm node with nothing running: spares may come
            if stop.is_set():
                return  # stopped by the group: nothing more is pushed
            for rank, items in self.processes.take().items():
                if rank < 0:
                    self._spare_said(summary, rank, items)
                else:
                    summary.take(rank, items)
            for end in ends:
                if end.rank < 0:
                    summary.add("spare", SpareNews(self.node, end.rank, "lost", end.pid or 0, end.text, *self._where))
                else:
                    summary.end(end)
            devices = self._device_poll.take() if self._device_poll is not None else ()
            due = cadence.due(summary.has_news or bool(devices), summary.has_beat, time.monotonic())
            report = summary.report(time.time()) if due == "report" else None
            if due == "keepalive" or (report is None and devices):
                report = NodeReport(self.node, summary.subrun, time.time())
            if report is not None and devices:
                report = replace(report, devices=devices)
            if report is not None:
                cadence.pushed(time.monotonic())
                self.lease.renew(self._push(inbox, [report]))

    def _spare_said(self, summary: NodeSummariser, key: int, items: list[tuple[str, object]]) -> None:
        """A spare's reports before it is named say nothing to the driver but that it is ready."""
        if any(kind == WAITING for kind, _ in items):
            summary.add("spare", SpareNews(self.node, key, "ready", self.processes.pids()[key], "", *self._where))

    def start_spares(self, count: int, buddy_offset: int) -> list[int]:
        """Fork ``count`` warm spares of the current sub-run (each builds the model, then waits to
        be named); their keys. Their readiness and loss are pushed as ``spare`` items. Each takes
        a free device slice (:meth:`_fork`); when none is left, :class:`NoFreeDevices` in this
        node's words, carrying the keys of the spares forked before it (``started``): they run,
        and the driver must know them."""
        self.lease.renew()
        config, plan, world, master = self._spare_start
        keys: list[int] = []
        for _ in range(count):
            key = spare_key(self._spares_started)
            try:
                self._fork(RankStart(config, plan, key, world, len(self.processes.pids()), *master,
                                     wraps=self._wraps, spare=True, buddy_offset=buddy_offset), "a warm spare")
            except NoFreeDevices as refused:
                refused.started = keys
                raise
            self._spares_started += 1
            keys.append(key)
        return keys

    def waiting(self) -> list[int]:
        """The node's ranks that wait in their warm link (a peer broke the group): a recovery's
        question, and the lost-node probe's (liveness.py), one call for the node's ranks."""
        self.lease.renew()
        return sorted(rank for rank in self.processes.waiting() if rank >= 0)

    def regroup(self, subrun: str, named: dict[int, int], answers: dict[int, Any],
                rank_nodes: Optional[dict[int, str]]) -> list[WorkerInfo]:
        """A warm recovery, on this node: each spare of ``named`` (key -> rank) becomes its rank,
        then every rank of ``answers`` is told where the group re-forms; reports from now on are
        ``subrun``'s. The named spares' :class:`WorkerInfo`."""
        self.lease.renew()
        assert self._summary is not None
        node_id, address = self._here()
        adopted = []
        for key, rank in named.items():
            self.processes.rename(key, rank)
            self._summary.adopt(rank)
            adopted.append(WorkerInfo(rank, self.processes.pids()[rank], node_id, address))
        self._infos = [info for info in self._infos if info.rank not in named.values()] + adopted
        self._summary.subrun = subrun
        if rank_nodes is not None:
            self._summary.rank_nodes = dict(rank_nodes)
        for rank, rejoin in answers.items():
            self.processes.answer(rank, rejoin)
        return adopted

    def describe(self) -> list[WorkerInfo]:
        """The node's ranks, once forked."""
        self._started.wait()
        return list(self._infos)

    def held(self) -> dict[str, float]:
        """The resources Ray gave this agent: its node's ranks' bundles, summed."""
        return dict(ray.get_runtime_context().get_assigned_resources())

    def ready(self) -> bool:
        """Whether the agent can serve a sub-run (it answers: it lives)."""
        self.lease.renew()
        return True

    def dump_stacks(self) -> dict[int, str]:
        """``{rank: text}``: each running rank's Python stacks, dumped with py-spy on this node."""
        self.lease.renew()
        py_spy = find_py_spy()
        return {info.rank: worker_header(info) + dump_pid(py_spy, info.pid) for info in self._infos}

    def kill_rank(self, rank: int) -> None:
        self.processes.kill(rank)

    def stop(self) -> None:
        """End the node's ranks; nothing more is pushed. The agent (and its fork server, with
        the trainer imported) stays for the next sub-run."""
        self.lease.renew()
        self._stop.set()
        self.processes.stop(STOP_GRACE_S)
        self._started.clear()

    def _stop_then_exit(self, code: int) -> None:
        """The driver is gone (:class:`SelfStop`): say so for each running rank, where a driver
        that is only silent may still read it, then end the ranks and this process."""
        summary, inbox, lost = self._summary, self._inbox, self.self_stop.lost
        if summary is not None and inbox is not None and lost is not None and not summary.done:
            pids = {info.rank: info.pid for info in self._infos}
            ends = tuple(RankEnd(rank, "error", stopped_itself(pids.get(rank, 0), rank, f"{lost.reason} (its node "
                                 f"agent's lease)"), time.time()) for rank in sorted(summary.running))
            try:
                ray.get(inbox.push.remote([NodeReport(self.node, summary.subrun, time.time(), ended=ends)]),
                        timeout=LOST_DRIVER_PUSH_S)
            except (RayActorError, GetTimeoutError):
                pass  # nobody is left to read it: the ranks end all the same
        self._stop.set()
        self.processes.stop(STOP_GRACE_S)
        os._exit(code)

    def pid(self) -> int:
        return os.getpid()
