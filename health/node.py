"""One node's health report: what every probe found, measured and saw."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from health.findings import EvidenceValue, Finding, ProbeResult, Severity, worst


@dataclass
class NodeReport:
    """Everything the probes said about one node; JSON-able via :meth:`to_dict`."""

    node: str
    """Node name as the cluster knows it (host name or Ray node id)."""
    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    """Measured figures, compared against the fleet (``compute.matmul_tflops`` ...)."""
    facts: dict[str, EvidenceValue] = field(default_factory=dict)
    """Inventory and versions (``software.torch`` ...)."""
    started_at: float = 0.0
    """Unix time the checks started."""
    seconds: float = 0.0
    """How long the checks took."""

    @classmethod
    def from_probes(cls, node: str, results: Iterable[ProbeResult], started_at: float = 0.0,
                    seconds: float = 0.0) -> "NodeReport":
        merged = ProbeResult()
        for result in results:
            merged.extend(result)
        return cls(node, merged.findings, merged.figures, merged.facts, started_at, seconds)

    @property
    def severity(self) -> Severity:
        return worst(self.findings)

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "severity": self.severity.value,
            "findings": [f.to_dict() for f in self.findings],
            "figures": dict(self.figures),
            "facts": dict(self.facts),
            "started_at": self.started_at,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "NodeReport":
        return cls(
            node=str(data["node"]),
            findings=[Finding.from_dict(f) for f in data.get("findings", [])],
            figures={str(k): float(v) for k, v in data.get("figures", {}).items()},
            facts=dict(data.get("facts", {})),
            started_at=float(data.get("started_at", 0.0)),
            seconds=float(data.get("seconds", 0.0)),
        )
