"""The words of a warm group's spare events, and the rank a spare holds until it is named.

The warm spares themselves are forked under the node agents (runmgr/workers/agent_spares.py's
pool, runmgr/workers/node_agent.py's ``start_spares``). The per-rank design's pool of spare
actors that lived here was retired with the per-rank warm group (docs/warm_restart.md).
"""

from __future__ import annotations

from typing import Optional

from runmgr.controller.group import SpareEvent, SpareEventKind, WorkerInfo

SPARE_RANK = -1
"""The rank a spare's :class:`WorkerInfo` holds until a recovery names the one it replaces."""


def spare_event(kind: SpareEventKind, text: str, ready: int, wanted: int,
                worker: Optional[WorkerInfo] = None) -> SpareEvent:
    """A change of a warm group's spares, worded with how many are ready."""
    return SpareEvent(kind, f"{text} ({ready} of {wanted} ready)", ready, wanted, worker)
