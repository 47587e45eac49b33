"""Which of a node's device slices each of its live processes holds.

On an accelerator node the agent holds the devices of all its node's ranks and spares (the sum
of their bundles); each process it forks gets a slice of them, ``devices_per_rank`` ids, in the
variable Ray would have set for a per-rank actor (runmgr/placement.py ``rank_device_env``: the
device layer names it, this does not). A slice is held by a process, known by its pid, not by
its rank: a spare that a warm recovery names a lost rank keeps the devices it built its model
on, and the lost rank's slice is free once its process is gone, for the spare that refills it.

Ray-free: the agent (runmgr/workers/node_agent.py) says which pids live.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Optional

from runmgr.placement import rank_device_env


class NoFreeDevices(Exception):
    """A process to be forked on a node whose device slices are all held by live processes."""

    def __init__(self, text: str, started: Sequence[int] = ()) -> None:
        """``started``: the spares a call for several forked before this refusal (their keys),
        which the driver's pool keeps. An attribute, so that it crosses Ray's pickling with the
        words (an exception's ``__dict__`` is pickled with its arguments)."""
        super().__init__(text)
        self.started = list(started)


class DeviceSlices:
    """The slices of one node's device ids and the live process holding each."""

    def __init__(self, node: str, device_kind: str, ids: Sequence[str], per_process: int) -> None:
        """``ids``: the device ids Ray gave the node's agent; ``per_process``: how many each
        forked rank or spare gets (``cluster.devices_per_worker``)."""
        self.node = node
        self.device_kind = device_kind
        self.ids = tuple(ids)
        self.per_process = per_process
        self._holders: dict[int, int] = {}
        """Slice index -> the pid of the process that holds it."""

    @property
    def count(self) -> int:
        return len(self.ids) // self.per_process if self.per_process > 0 else 0

    def take(self, live_pids: Collection[int], what: str) -> int:
        """The lowest slice no live process holds (a holder not in ``live_pids`` has ended: its
        slice is free again); :class:`NoFreeDevices` in the node's words when there is none.
        ``what``: the process to be forked (``rank 3``, ``a warm spare``), for those words.
        Call :meth:`hold` once it is forked."""
        self._holders = {index: pid for index, pid in self._holders.items() if pid in live_pids}
        free = [index for index in range(self.count) if index not in self._holders]
        if not free:
            held = ", ".join(f"{self._ids_of(index)} by pid {pid}" for index, pid in sorted(self._holders.items()))
            # Fewer ids than one process needs (Ray told of GPUs it gave no ids for) or every slice held.
            taken = f"every slice held by a live process ({held})" if held else "too few for one slice"
            raise NoFreeDevices(f"node {self.node}'s agent holds {len(self.ids)} {self.device_kind} device(s) "
                                f"({','.join(self.ids) or 'none'}), {self.per_process} per process, {taken}: "
                                f"no device for {what}")
        return free[0]

    def env(self, index: int) -> dict[str, str]:
        """The environment that gives a process slice ``index``'s devices only."""
        return rank_device_env(self.device_kind, self.ids, self.per_process, index)

    def hold(self, index: int, pid: int) -> None:
        """Process ``pid`` was forked with slice ``index``."""
        self._holders[index] = pid

    def held(self) -> dict[int, str]:
        """``{pid: "0,1"}``: the device ids each holder has (it may have ended since)."""
        return {pid: self._ids_of(index) for index, pid in self._holders.items()}

    def clear(self) -> None:
        """Every process ended (a sub-run's stop): every slice is free."""
        self._holders.clear()

    def _ids_of(self, index: int) -> str:
        return ",".join(self.ids[index * self.per_process:(index + 1) * self.per_process])


def slices_for(node: str, device_kind: str, ids: Optional[Sequence[str]], per_process: int) -> Optional[DeviceSlices]:
    """The node's slices; None where its processes hold no devices (a CPU node, or none per rank)."""
    if ids is None or per_process <= 0:
        return None
    return DeviceSlices(node, device_kind, ids, per_process)
