"""What detectors report: an incident with its onset, evidence and culprits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Mapping, Optional

from runmgr.choices import IncidentKind, InstabilityKind

LOSS_SPIKE: Final = IncidentKind.loss_spike
GRAD_SPIKE: Final = IncidentKind.grad_spike
NONFINITE: Final = IncidentKind.nonfinite
LOSS_SCALE: Final = IncidentKind.loss_scale
HANG: Final = IncidentKind.hang
STRAGGLER: Final = IncidentKind.straggler
SLOWDOWN: Final = IncidentKind.slowdown
DEVICE_FAULT: Final = IncidentKind.device_fault
WORKER_DEATH: Final = IncidentKind.worker_death
LAUNCH_FAILURE: Final = IncidentKind.launch_failure
STORAGE_OUTAGE: Final = IncidentKind.storage_outage
EARLY_EXIT: Final = IncidentKind.early_exit

INCIDENT_KINDS: tuple[str, ...] = IncidentKind.values()
INSTABILITY_KINDS = frozenset(InstabilityKind.values())
"""Kinds met by the optimisation ladder (rollback, lower LR, reset Adam)."""


@dataclass(frozen=True)
class Incident:
    """Something a detector saw, with the numbers that made it fire."""

    kind: IncidentKind
    """What was seen."""
    time: float
    """When it was detected (the injected ``now``)."""
    description: str
    """One line with the numbers, for people and for the logbook."""
    subrun: str = ""
    """Sub-run the evidence came from."""
    onset_step: Optional[int] = None
    """First step that looked wrong."""
    peak_step: Optional[int] = None
    """Step of the worst value (spikes)."""
    recovered: bool = False
    """True when it went away by itself within the grace window."""
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    onset_sample: Optional[int] = None
    """Stream position where the onset step's batch starts (consumed samples before it)."""
    samples_per_step: Optional[int] = None
    """Global batch in samples around the onset, to turn steps into sample positions."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """The figures behind the incident (baseline, peak, z-score, cause, ...)."""

    def summary(self) -> str:
        """``kind at step N: description``."""
        where = f" at step {self.onset_step}" if self.onset_step is not None else ""
        return f"{self.kind}{where}: {self.description}"

    def to_dict(self) -> dict:
        """Plain data for JSON and the logbook."""
        return {
            "kind": self.kind,
            "time": self.time,
            "description": self.description,
            "subrun": self.subrun,
            "onset_step": self.onset_step,
            "peak_step": self.peak_step,
            "recovered": self.recovered,
            "ranks": list(self.ranks),
            "nodes": list(self.nodes),
            "onset_sample": self.onset_sample,
            "samples_per_step": self.samples_per_step,
            "evidence": dict(self.evidence),
        }
