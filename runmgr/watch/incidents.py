"""What detectors report: an incident with its onset, evidence and culprits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

LOSS_SPIKE = "loss_spike"
GRAD_SPIKE = "grad_spike"
NONFINITE = "nonfinite"
LOSS_SCALE = "loss_scale"
HANG = "hang"
STRAGGLER = "straggler"
SLOWDOWN = "slowdown"
DEVICE_FAULT = "device_fault"
WORKER_DEATH = "worker_death"

INCIDENT_KINDS = (
    LOSS_SPIKE, GRAD_SPIKE, NONFINITE, LOSS_SCALE, HANG, STRAGGLER, SLOWDOWN, DEVICE_FAULT, WORKER_DEATH,
)
INSTABILITY_KINDS = frozenset({LOSS_SPIKE, GRAD_SPIKE, NONFINITE, LOSS_SCALE})
"""Kinds met by the optimisation ladder (rollback, lower LR, reset Adam)."""


@dataclass(frozen=True)
class Incident:
    """Something a detector saw, with the numbers that made it fire."""

    kind: str
    """One of INCIDENT_KINDS."""
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
