"""The lineage's recent local norms (every weight's gradient norm at the steps that reported
them), kept by the watcher so that an instability can be traced to the layers it entered by.

Pure: observations in, a series out. A new sub-run that resumes at step S redoes what
came after S, so what an earlier sub-run recorded from there is forgotten. The judge
reads :meth:`LocalNormsMemory.series` when a spike is reported and adds the evidence
``local_norms`` (runmgr/controller/judge.py, with logbook/local_norms.py's analysis).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from runmgr.watch.observations import LocalNormsObservation

KEPT_STEPS = 1000
"""Recorded steps kept (every 100th step over 100,000 steps by default; the demo records each)."""


class LocalNormsMemory:
    """The lineage's recorded local norms, by step."""

    def __init__(self, kept_steps: int = KEPT_STEPS) -> None:
        self.kept_steps = kept_steps
        self._norms: OrderedDict[int, tuple[str, dict[str, float]]] = OrderedDict()
        self._subrun: Optional[str] = None

    def note(self, subrun: str, step: int) -> None:
        """A report of ``subrun`` at ``step``: the first one of a new sub-run forgets what
        other sub-runs recorded at or after it (those steps are being redone)."""
        if subrun == self._subrun:
            return
        self._subrun = subrun
        for stale in [s for s, (owner, _) in self._norms.items() if s >= step and owner != subrun]:
            del self._norms[stale]

    def update(self, obs: LocalNormsObservation) -> None:
        self.note(obs.subrun, obs.step)
        self._norms[obs.step] = (obs.subrun, dict(obs.norms))
        self._norms = OrderedDict(sorted(self._norms.items()))
        while len(self._norms) > self.kept_steps:
            self._norms.popitem(last=False)

    def series(self) -> dict[int, dict[str, float]]:
        """The kept norms by step, the lineage's view (oldest first)."""
        return {step: norms for step, (_, norms) in self._norms.items()}
