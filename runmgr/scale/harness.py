"""A simulated job of any size through the real driver: the worker group's polling, the
controller, the judge, the logbook and the metrics exporter, on a local Ray whose actors
host the simulated ranks (runmgr/scale/hosts.py). It measures what the driver costs:
CPU per second and per step, the poll period it achieves, its memory, the time from a
fault to its incident, the logbook's bytes and the metrics' series.

The driver here is this process. Not in it yet: the device poll (one actor per node
reading the node's npu-smi or nvidia-smi in the real design), the S3 mirror, chaos.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import ray
from prometheus_client import CollectorRegistry

from logbook import Logbook
from runmgr.config.compose import load_run_config, recorded_config
from runmgr.config.schema import RunConfig
from runmgr.controller.judge import ClusterSlots, Judge
from runmgr.controller.judgement import Judgement
from runmgr.controller.machine import Controller, SubrunIds
from runmgr.controller.states import Launching, Running, State
from runmgr.metrics.exporter import MetricsObserver
from runmgr.observers.logbook_writer import LogbookObserver
from runmgr.resume import ResumePoint
from runmgr.controller.group import WorkerGroup
from runmgr.scale.agent_hosts import RemoteNodeAgentHost, SimulatedNodeAgents
from runmgr.scale.hosts import RemoteRankHost, SimulatedRanks
from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.scale.ranks import JobScript, RankFault
from runmgr.workers.group import RayWorkerGroup
from runmgr.workers.warm_agents import WarmAgentGroup
from runmgr.workers.warm_rules import WARM_SETTLE_S
from trainer.plan import ResumePlan


Design = Literal["per_rank", "agents", "warm"]


@dataclass(frozen=True)
class ScaleJob:
    """One simulated job for the harness."""

    ranks: int
    ranks_per_node: int = 8
    hosts: int = 4
    """Ray actor processes that hold the simulated nodes."""
    step_s: float = 6.0
    train_iters: int = 20
    save_interval: int = 5
    faults: tuple[RankFault, ...] = ()
    poll_interval_s: float = 0.2
    """``controller.poll_interval_s``."""
    hang_min_s: float = 1.0
    """``watcher.hang.step.min_s``: the learned hang timeout's floor (the default's 60 s would
    make every hang in a short simulated run take a minute)."""
    design: Design = "per_rank"
    """``per_rank``: today's worker group, one actor (here, a simulated one) per rank, each drained
    every poll; ``agents``: one agent per node pushing a summary, one drain per poll; ``warm``:
    the agents with ``warm_spares`` spares under them (runmgr/workers/warm_agents.py's group)."""
    warm_spares: int = 1
    """``warm``: ``controller.warm_spares``, in the slots after the ranks' (spare-only nodes when
    the ranks fill theirs)."""
    push_interval_s: float = 0.5
    """``agents``: how often a node's agent pushes its report (at once when a rank ended)."""

    @property
    def spares(self) -> int:
        return self.warm_spares if self.design == "warm" else 0

    @property
    def nodes(self) -> list[str]:
        return [f"sim{i:05d}" for i in range(math.ceil((self.ranks + self.spares) / self.ranks_per_node))]

    def script(self) -> JobScript:
        return JobScript(world=self.ranks, step_s=self.step_s, save_interval=self.save_interval, faults=self.faults)

    def config(self, run_dir: Path) -> RunConfig:
        """The run's config: the defaults' watcher and policy, this job's size and pace."""
        return load_run_config("demo", [
            "chaos=none", "watcher=default", "policy=default", "health.skip=true", f"run.dir={run_dir}",
            f"cluster.num_workers={self.ranks}", "training.micro_batch_size=1",
            f"training.global_batch_size={self.ranks}", f"training.train_iters={self.train_iters}",
            f"checkpoint.save_interval={self.save_interval}", f"controller.poll_interval_s={self.poll_interval_s}",
            f"controller.worker_lease_s={max(10.0, 20 * self.poll_interval_s)}",  # the config's rule
            f"watcher.hang.step.min_s={self.hang_min_s}", "training.local_norms_interval=0",
            *([f"controller.warm_spares={self.spares}", "checkpoint.memory_interval=1"] if self.spares else [])])


@dataclass
class Measures:
    """What the driver did, seen from its observers and its process."""

    started: float = field(default_factory=time.monotonic)
    polls: list[float] = field(default_factory=list)
    """When each poll came back (monotonic)."""
    poll_cpu: list[float] = field(default_factory=list)
    """The driver's CPU seconds when each poll came back."""
    judgements: list[tuple[float, Judgement]] = field(default_factory=list)
    """Wall time the observers heard each judgement, and the judgement."""
    steps: int = 0
    memory: list[tuple[int, float]] = field(default_factory=list)
    """(steps reported so far, the driver's resident MB) every ``MEMORY_EVERY`` steps."""
    running: list[float] = field(default_factory=list)
    """Wall time each sub-run began running (its ranks started, or re-formed warm)."""
    restarts: list[str] = field(default_factory=list)
    """``warm`` or ``cold``, per restart, in order."""


MEMORY_EVERY = 50
"""Steps between two readings of the driver's memory."""


def resident_mb() -> float:
    """This process's resident memory now (its peak where /proc is not there)."""
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return pages * resource.getpagesize() / 2**20


class MeasuringObserver:
    """Takes the driver's figures at each transition, poll and judgement."""

    def __init__(self, measures: Measures) -> None:
        self.measures = measures

    def on_transition(self, old: Optional[State], new: State) -> None:
        if isinstance(new, Running) and not isinstance(old, Running):
            self.measures.running.append(time.time())
        if isinstance(new, Launching) and "restart" in new.evidence:
            self.measures.restarts.append(str(new.evidence["restart"]))

    def on_poll(self, state: Running, poll) -> None:
        self.measures.polls.append(time.monotonic())
        self.measures.poll_cpu.append(time.process_time())
        before = self.measures.steps
        self.measures.steps += len(poll.steps)
        if before // MEMORY_EVERY != self.measures.steps // MEMORY_EVERY:
            self.measures.memory.append((self.measures.steps, resident_mb()))

    def on_judgement(self, state, judgement: Judgement) -> None:
        self.measures.judgements.append((time.time(), judgement))


@dataclass(frozen=True)
class ScaleResult:
    """The figures of one simulated run."""

    ranks: int
    nodes: int
    design: Design
    final: str
    """The run's last state (``Finished``, ``Failed``)."""
    driver_cpu_s: float
    wall_s: float
    steps: int
    poll_periods: tuple[float, ...]
    incidents: tuple[tuple[str, float], ...]
    """Each incident's kind and the seconds from its fault (the first of the kind that causes
    it) to the driver's judgement; 0 for a kind no fault causes."""
    decisions: tuple[str, ...]
    """The action decided on each incident, in order."""
    resumed: tuple[float, ...]
    """Per incident: the seconds from its fault to the next sub-run running (the driver's side
    of a recovery: a warm group re-formed, or a cold one's ranks started); -1 when none ran."""
    restarts: tuple[str, ...]
    """``warm`` or ``cold``, per restart, in order."""
    started_ranks: int
    """Ranks the hosts started over the run (a warm recovery starts none)."""
    max_rss_mb: float
    memory: tuple[tuple[int, float], ...]
    """(steps, resident MB) of the driver every ``MEMORY_EVERY`` steps."""
    logbook_bytes: int
    metric_series: int


def run_job(job: ScaleJob, run_dir: Path) -> ScaleResult:
    """Drive ``job`` to its end through the real controller; Ray must be initialised."""
    config = job.config(run_dir)
    hosts = [RemoteRankHost.remote(job.script()) if job.design == "per_rank"
             else RemoteNodeAgentHost.remote(job.script(), job.push_interval_s) for _ in range(job.hosts)]
    if job.design != "per_rank":
        ray.get([host.ready.remote() for host in hosts])
    registry = CollectorRegistry()
    measures = Measures()
    with Logbook.open(run_dir) as book:
        exporter = MetricsObserver(book, job.train_iters)
        registry.register(exporter)
        controller = build_controller(job, config, book, hosts, [MeasuringObserver(measures), exporter])
        cpu0, wall0 = time.process_time(), time.monotonic()
        final = controller.run()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        series = sum(len(metric.samples) for metric in registry.collect())
    met = _fault_times(hosts)
    faulted = [met.get(_fault_kind(j.incident.kind), when) for when, j in measures.judgements]
    incidents = tuple((str(j.incident.kind.value), when - fault)
                      for fault, (when, j) in zip(faulted, measures.judgements))
    resumed = tuple(next((t - fault for t in measures.running if t > when), -1.0)
                    for fault, (when, _) in zip(faulted, measures.judgements))
    started = sum(ray.get([host.started_ranks.remote() for host in hosts])) if job.design != "per_rank" else 0
    return ScaleResult(
        ranks=job.ranks, nodes=len(job.nodes), design=job.design, final=type(final).__name__, driver_cpu_s=cpu, wall_s=wall,
        steps=measures.steps, poll_periods=tuple(b - a for a, b in zip(measures.polls, measures.polls[1:])),
        incidents=incidents, decisions=tuple(str(j.decision.action.value) for _, j in measures.judgements),
        resumed=resumed, restarts=tuple(measures.restarts), started_ranks=started,
        max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, memory=tuple(measures.memory),
        logbook_bytes=sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()), metric_series=series)


def build_controller(job: ScaleJob, config: RunConfig, book: Logbook, hosts: list, observers: list) -> Controller:
    """The controller a launch builds, with the simulated ranks in place of trainer processes."""
    nodes = job.nodes
    trainer_config = config.trainer_config()
    if job.design == "warm":
        warm_agents = SimulatedNodeAgents(hosts, nodes, job.ranks_per_node)

        def make_group() -> WorkerGroup:  # as runmgr/runners.py builds a warm launch's group
            return WarmAgentGroup(AgentWorkerGroup(warm_agents, job.ranks, settle_s=WARM_SETTLE_S), warm_agents,
                                  job.spares)
    elif job.design == "agents":
        agents = SimulatedNodeAgents(hosts, nodes, job.ranks_per_node)  # one for the lineage: keys stay unique

        def make_group() -> WorkerGroup:
            return AgentWorkerGroup(agents, job.ranks)
    else:
        ranks = SimulatedRanks(hosts, nodes, job.ranks_per_node)  # one for the lineage: slots stay unique

        def make_group() -> WorkerGroup:
            return RayWorkerGroup(config.cluster, "cpu", config.controller.start_timeout_s,
                                  config.controller.worker_lease_s, rank_actors=ranks)

    def resume_at(step: Optional[int], why: str) -> ResumePoint:
        saved = ((step or 0) // job.save_interval) * job.save_interval
        return ResumePoint(f"sim://step/{saved}" if saved else None, saved)

    slots = ClusterSlots(lambda: {node: job.ranks_per_node for node in nodes}, (job.ranks,))
    judge = Judge(config.watcher, config.policy, lambda max_step: [], slots)
    ids = SubrunIds(1, 0)
    first = ids.take()
    initial = Launching(first, ResumePlan(subrun=first, data_parallel_size=job.ranks), 0, "launch", {})
    logbook = LogbookObserver(book, recorded_config(config))
    return Controller(initial, trainer_config, make_group=make_group, resume_at=resume_at, judge=judge,
                      subrun_ids=ids, poll_interval_s=job.poll_interval_s,
                      observers=[logbook, *observers])


def _fault_kind(incident_kind: str) -> str:
    return {"worker_death": "kill", "hang": "hang", "straggler": "slow"}.get(str(incident_kind), str(incident_kind))


def _fault_times(hosts: list) -> dict[str, float]:
    """When each kind of fault happened first (the hosts' record), by the fault's kind."""
    times: dict[str, float] = {}
    for met in ray.get([host.met_faults.remote() for host in hosts]):
        for fault, when in met:
            times[fault.kind] = min(times.get(fault.kind, when), when)
    return times
