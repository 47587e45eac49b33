"""The lineage's recent local norms (every weight's gradient norm at the steps that reported
them), kept by the watcher so that an instability can be traced to the layers it entered by.

Pure: observations in, a series out. A new sub-run that resumes at step S redoes what
came after S, so what an earlier sub-run recorded from there is forgotten. The judge
reads :meth:`LocalNormsMemory.series` when a spike is reported and adds the evidence
``local_norms`` (runmgr/controller/judge.py, with logbook/local_norms.py's analysis).
"""

from __future__ import annotations

from runmgr.watch.observations import LocalNormsObservation

KEPT_STEPS = 1000
"""Recorded steps kept (every 100th step over 100,000 steps by default; the demo records each)."""


class LocalNormsMemory:
    """The lineage's recorded local norms, by step."""

    def __init__(self, kept_steps: int = KEPT_STEPS) -> None:
        self.kept_steps = kept_steps
        self._norms: dict[int, tuple[str, dict[str, float]]] = {}
        self._earliest: dict[str, int] = {}
        """The earliest step each sub-run reported."""

    def note(self, subrun: str, step: int) -> None:
        """A report of ``subrun`` at ``step``: the earliest one of a sub-run forgets what
        other sub-runs recorded at or after it (those steps are being redone)."""
        if step >= self._earliest.get(subrun, step + 1):
            return
        self._earliest[subrun] = step
        for stale in [s for s, (owner, _) in self._norms.items() if s >= step and owner != subrun]:
            del self._norms[stale]

    def update(self, obs: LocalNormsObservation) -> None:
        self.note(obs.subrun, obs.step)
        self._norms[obs.step] = (obs.subrun, dict(obs.norms))
        if len(self._norms) > self.kept_steps:
            del self._norms[min(self._norms)]

    def series(self) -> dict[int, dict[str, float]]:
        """The kept norms by step, the lineage's view (oldest first)."""
        return {step: self._norms[step][1] for step in sorted(self._norms)}
