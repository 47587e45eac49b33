"""Where node agents push their reports and the driver takes them, one call per poll.

The driver of the per-rank design asks every rank for its news each poll (one remote call per
rank). In the agent design every node's agent pushes one :class:`runmgr.agents.report.NodeReport`
per interval here, and the driver drains them all with one call, which returns at once when a
rank has ended (a report that is ``urgent``) and otherwise after the poll's wait. A push's
answer is how long the driver has not drained: the agents' lease on the driver.
"""

from __future__ import annotations

import asyncio
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runmgr.agents.report import NodeReport

MAX_CALLS_IN_FLIGHT = 10_000
"""Pushes from every node's agent and the driver's drain are served together."""


class ReportInbox:
    """The reports pushed since the last drain, in arrival order."""

    def __init__(self) -> None:
        self._reports: list[NodeReport] = []
        self._urgent = asyncio.Event()
        self._drained = time.monotonic()

    async def push(self, reports: list[NodeReport]) -> float:
        """Keep ``reports`` for the driver; the seconds since it last drained."""
        self._reports.extend(reports)
        if any(report.urgent for report in reports):
            self._urgent.set()
        return time.monotonic() - self._drained

    async def drain(self, wait_s: float) -> list[NodeReport]:
        """Everything pushed since the last drain, after ``wait_s`` or as soon as a report is urgent."""
        if not self._urgent.is_set():
            try:
                await asyncio.wait_for(self._urgent.wait(), timeout=wait_s)
            except asyncio.TimeoutError:
                pass
        self._urgent.clear()
        reports, self._reports = self._reports, []
        self._drained = time.monotonic()
        return reports


RemoteReportInbox = ray.remote(num_cpus=0, max_concurrency=MAX_CALLS_IN_FLIGHT)(ReportInbox)


def inbox_beside_driver():
    """A new :class:`ReportInbox` actor on the driver's node (it dies with that node's Ray)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return RemoteReportInbox.options(scheduling_strategy=here).remote()


class KeptInbox:
    """One :class:`ReportInbox` on the driver's node for every sub-run of a launch: a new actor
    per sub-run is a new Ray worker process (about half a CPU-second to start). Reports a
    stopped sub-run's agents pushed late stay in it; the group drops them by their sub-run."""

    def __init__(self) -> None:
        self._actor = None

    def actor(self):
        """The inbox, started beside the driver the first time it is asked for."""
        if self._actor is None:
            self._actor = inbox_beside_driver()
        return self._actor

    def close(self) -> None:
        """End the inbox (the launch ends); the next :meth:`actor` starts another."""
        if self._actor is not None:
            ray.kill(self._actor, no_restart=True)
            self._actor = None
