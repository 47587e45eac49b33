"""When a node's agent pushes: news at once, a quiet node's beat at a pace the inbox can take.

One actor, the driver's inbox, takes every node's pushes. A quiet node has nothing to say but
its laggard's beat, which changes at every step: at 2,048 nodes and 1 s steps that would be
2,048 calls a second, past what one inbox serves (``bench/inbox_load.py``: about 1,300 calls a
second here, its event loop at 69% of a core beside the agents' calls; 341 calls a second at
6 s steps, 23%). So a report with news (a step report, a checkpoint, a pause, a rank's end)
goes at the next push interval, and a beat alone waits until the node's beat interval,
which grows with the nodes so that all the quiet beats together stay near
:data:`QUIET_CALLS_PER_S`. A beat that arrives that late is still judged by its own time: a
hang's timeout is never shorter than ``watcher.hang.*.min_s`` (60 s for a step by default),
and at 2,048 nodes a beat waits at most 4 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

QUIET_CALLS_PER_S = 500.0
"""The calls a second that all quiet nodes' beats together may make to the inbox."""
KEEPALIVE_PUSHES = 4
"""With nothing at all to say (every rank silent: held, or stopped by a fault), an empty report
still goes every this many push intervals, or at the beat interval if that is longer: its
answer renews the agent's lease on the driver."""
LEASE_SHARE = 0.25
"""A beat never waits longer than this share of the agents' lease on the driver."""

Push = Literal["report", "keepalive"]


def beat_interval_s(push_interval_s: float, nodes: int, lease_s: float = float("inf")) -> float:
    """How often a quiet node of a job of ``nodes`` pushes its beat: the push interval up to
    ``QUIET_CALLS_PER_S x push_interval_s`` nodes, then growing with them (never past a
    quarter of the lease its answers renew)."""
    return max(push_interval_s, min(nodes / QUIET_CALLS_PER_S, lease_s * LEASE_SHARE))


@dataclass
class PushCadence:
    """What an agent should push at ``now`` (a monotonic clock), given whether it has news."""

    push_interval_s: float
    beat_interval_s: float
    _last_push: Optional[float] = field(default=None, init=False)

    def due(self, has_news: bool, has_beat: bool, now: float) -> Optional[Push]:
        """``report`` (what the summariser has), ``keepalive`` (an empty report) or None."""
        # A tenth of an interval's slack: the agent's wait for its ranks' news may end a hair early.
        since = float("inf") if self._last_push is None else now - self._last_push + self.push_interval_s / 10
        if has_news or (has_beat and since >= self.beat_interval_s):
            return "report"
        if since >= max(KEEPALIVE_PUSHES * self.push_interval_s, self.beat_interval_s):
            return "keepalive"
        return None

    def pushed(self, now: float) -> None:
        self._last_push = now
