"""What the controller needs of the ranks of a sub-run, without Ray.

The controller drives a :class:`WorkerGroup`; the Ray one lives in
:mod:`runmgr.workers.group`, tests use fakes. Everything here is plain data,
so the controller, the judge and their tests never import Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from runmgr.policy.warm import WarmCover
from runmgr.watch.deaths import PEER_ECHO_CAUSES, classify
from runmgr.watch.observations import DeviceObservation
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, StartReport, StepReport


@dataclass(frozen=True)
class WorkerInfo:
    """Where a rank lives: what ``runmgr status`` shows and ``kill -9`` needs."""

    rank: int
    pid: int
    node_id: str
    node_ip: str

    def to_dict(self) -> dict:
        return {"rank": self.rank, "pid": self.pid, "node": self.node_id, "node_ip": self.node_ip}


FailureKind = Literal["died", "error"]
SpareEventKind = Literal["spare_ready", "spare_refilling", "spare_not_refilled", "spare_not_started", "spare_lost"]


@dataclass(frozen=True)
class SpareEvent:
    """A change in a warm group's spares, for the logbook: one is ready (waiting to be named),
    one starts to replace a spare a warm restart used, a used one cannot be replaced (no free
    slot off the nodes the plan avoids), one asked for at the sub-run's start was not started
    (its node's agent had no free device for it: the run goes on with fewer), or one was lost
    (it died, or did not start in time)."""

    kind: SpareEventKind
    text: str
    ready: int
    """Ready spares after this event."""
    wanted: int
    """``controller.warm_spares``."""
    worker: WorkerInfo | None = None
    """The spare's actor, once it has started."""

    def to_dict(self) -> dict:
        return {"ready": self.ready, "wanted": self.wanted,
                "worker": self.worker.to_dict() if self.worker is not None else None}


@dataclass(frozen=True)
class WorkerFailure:
    """A rank that stopped: ``died`` (its process is gone) or ``error`` (it raised)."""

    rank: int
    kind: FailureKind
    text: str
    worker: WorkerInfo | None
    time: float
    exit_code: int | None = None
    """The failed process's exit status (negative: the signal that ended it), when known."""
    output: tuple[str, ...] = ()
    """The last lines its process printed (stdout and stderr), oldest first, when the group
    reads them (a Megatron node: torchrun's stream, its ranks' lines as they came)."""

    @property
    def is_peer_echo(self) -> bool:
        """True when this rank only saw another rank go away or fall silent: a
        broken gloo socket, an NCCL watchdog timeout or remote error, an HCCL
        notify wait or lost heartbeat. The real failure is elsewhere."""
        return self.kind == "error" and classify(self.text).name in PEER_ECHO_CAUSES


@dataclass(frozen=True)
class OutputLine:
    """One line a node's command printed (a Megatron job's torchrun, stdout and stderr)."""

    node: int
    text: str


@dataclass
class GroupPoll:
    """What one poll of the group brought back."""

    steps: list[StepReport] = field(default_factory=list)
    checkpoints: list[CheckpointReport] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    node_beats: list[Heartbeat] = field(default_factory=list)
    """Beats that each stand for every rank of their node (a node agent's summary: its laggard
    rank's last beat, runmgr/agents/summary.py): the hang detector watches the node."""
    pause_beats: list[Heartbeat] = field(default_factory=list)
    """A node agent's ranks' beats into and out of a pause (chaos's ``pause_at_step``), once per
    change: the run's status and chaos read them with :attr:`heartbeats`; the hang detector
    watches :attr:`node_beats`."""
    starts: list[StartReport] = field(default_factory=list)
    local_norms: list[LocalNormsReport] = field(default_factory=list)
    """Per-weight gradient norms of the steps that reported them (rank 0)."""
    finished_ranks: list[int] = field(default_factory=list)
    failures: list[WorkerFailure] = field(default_factory=list)
    observations: list = field(default_factory=list)
    """Watcher inputs the group read itself (a Megatron job's log: its step lines, straggler
    timings); when non-empty the judge uses them instead of converting ``steps``, which stay
    for the observers."""
    commands: list[dict] = field(default_factory=list)
    """The exact command and environment of each node of a sub-run that runs a command
    (``NodeCommand.masked()``: secrets masked), on its first poll: the logbook records them."""
    spare_events: list[SpareEvent] = field(default_factory=list)
    """What happened to a warm group's spares since the last poll."""
    ready_spares: int | None = None
    """A warm group's ready spares now (None: a group that keeps no spares)."""
    output: list[OutputLine] = field(default_factory=list)
    """Every line the nodes' commands printed since the last poll, in arrival order (a group
    that runs commands; the judge keeps the last of them for incidents that need them)."""
    devices: list[DeviceObservation] = field(default_factory=list)
    """Device readings the group's node agents took of their nodes, oldest first (the device poll
    folded into the agents); the judge reads them with the device poll's."""
    waiting_ranks: list[int] = field(default_factory=list)
    """Ranks that, when drained, waited in their warm link for the group to re-form (a peer
    broke it): a warm group then probes the others (runmgr/workers/liveness.py)."""


class WorkerGroup(Protocol):
    """The ranks of one sub-run. ``start`` places them as the plan says (its
    data-parallel size, away from its nodes to avoid) or raises
    :class:`runmgr.errors.ClusterError`; it never changes the plan itself."""

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]: ...

    def poll(self, timeout_s: float) -> GroupPoll: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class WarmStart:
    """What a warm restart asks of the group: the surviving ranks go on from their memory,
    ``ranks`` start on ready spares restored from a peer's snapshot at ``step``."""

    step: int
    ranks: tuple[int, ...]
    avoid_nodes: tuple[str, ...] = ()
    """Nodes no spare may be taken from (the plan's nodes to avoid)."""


class WarmRecoveryError(Exception):
    """A warm restart could not be carried out (a spare or a peer's memory failed);
    the group has stopped its ranks and a cold restart follows. One line."""


@runtime_checkable
class WarmWorkerGroup(WorkerGroup, Protocol):
    """A group that keeps warm state: in-memory snapshots replicated to a peer and
    ready spares. The policy reads :meth:`warm_cover`; the controller calls
    :meth:`recover` for a warm decision."""

    def warm_cover(self) -> WarmCover: ...

    def recover(self, config: TrainerConfig, plan: ResumePlan, warm: WarmStart) -> list[WorkerInfo]:
        """Replace ``warm.ranks`` and re-form the process group with the survivors; the
        workers of the recovered sub-run, or :class:`WarmRecoveryError`."""


KILLED_EXIT_CODE = -9
"""A process ended by SIGKILL (the OOM killer, a person, a node's teardown): gone from outside,
whatever its launcher (torchrun) reports it as."""


def root_cause(failures: list[WorkerFailure]) -> WorkerFailure:
    """The failure that explains the others: a dead process (or one killed by SIGKILL, as a
    torchrun reports its node's rank) before an error, a real error before a peer's echo of it,
    then the earliest. A survivor's error that is not known as an echo (a job's own wording of
    a broken collective) still loses to the rank that was killed."""
    def rank_of(f: WorkerFailure) -> tuple[int, float]:
        killed = f.kind == "died" or f.exit_code == KILLED_EXIT_CODE
        order = 0 if killed else (2 if f.is_peer_echo else 1)
        return order, f.time
    return min(failures, key=rank_of)
