"""What the controller asks of a cluster that replaces excluded nodes (KubeRay on
Kubernetes: runmgr/kuberay.py), as a small protocol the tests fake, and the plain
records of what happened, which the next sub-run's start carries into the logbook."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Protocol, Sequence


@dataclass(frozen=True)
class ReplacementRequest:
    """The request to replace one excluded node, and how it went."""

    node: str
    """The excluded node, as decisions name it (node_name)."""
    requested: bool
    """True: the cluster took the request (the pod is being deleted; a new one follows)."""
    detail: str
    """What was done (pod, Kubernetes node, RayCluster and worker group), or why it was not."""
    pod: Optional[str] = None
    k8s_node: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RoomWait:
    """How the wait for the replacements ended."""

    ranks: int
    """Ranks awaited."""
    held: int
    """Ranks the usable nodes held when the wait ended."""
    waited_s: float
    timed_out: bool

    def to_dict(self) -> dict:
        return asdict(self)


class NodeReplacement(Protocol):
    """A cluster that brings up new nodes in place of excluded ones."""

    def replace(self, nodes: Sequence[str], reason: str) -> list[ReplacementRequest]:
        """Ask for a new node in place of each of ``nodes`` (``reason``: the decision's);
        never raises for a refused request: the record says why."""

    def await_ranks(self, ranks: int, timeout_s: float, avoid: Sequence[str]) -> RoomWait:
        """Wait until the usable nodes outside ``avoid`` hold ``ranks`` ranks, at most ``timeout_s``."""
