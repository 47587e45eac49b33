"""What a probe says about a node: findings with a severity, a stable code,
a sentence a person understands, and the evidence behind it.

Findings are plain, JSON-able data so that a report can be written, shipped
from a Ray worker to the driver, and read back without this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping, Union

EvidenceValue = Union[str, int, float, bool, None]


class Severity(str, Enum):
    """How bad a finding is: ``ok`` informs, ``warn`` admits with a note,
    ``fail`` excludes the node."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.FAIL: 2}


@dataclass(frozen=True)
class Finding:
    """One fact about a node, judged."""

    severity: Severity
    code: str
    """Stable dotted identifier, e.g. ``npu.ecc.double_bit``; tools match on it."""
    message: str
    """One sentence for a person: what is wrong and what to do."""
    evidence: Mapping[str, EvidenceValue] = field(default_factory=dict)
    """The raw figures or lines the judgement rests on."""

    def to_dict(self) -> dict:
        return {
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "Finding":
        return cls(
            severity=Severity(data["severity"]),
            code=str(data["code"]),
            message=str(data["message"]),
            evidence=dict(data.get("evidence", {})),
        )


def ok(code: str, message: str, **evidence: EvidenceValue) -> Finding:
    return Finding(Severity.OK, code, message, evidence)


def warn(code: str, message: str, **evidence: EvidenceValue) -> Finding:
    return Finding(Severity.WARN, code, message, evidence)


def fail(code: str, message: str, **evidence: EvidenceValue) -> Finding:
    return Finding(Severity.FAIL, code, message, evidence)


def worst(findings: Iterable[Finding]) -> Severity:
    """The most severe severity among ``findings`` (``ok`` when empty)."""
    return max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)


def at_least(findings: Iterable[Finding], severity: Severity) -> list[Finding]:
    """The findings whose severity is ``severity`` or worse, in order."""
    return [f for f in findings if f.severity.rank >= severity.rank]


@dataclass
class ProbeResult:
    """What one probe returns: findings plus the figures peers are compared on."""

    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    """Measured numbers keyed ``<probe>.<metric>`` or ``<probe>.<metric>@<subject>``."""
    facts: dict[str, EvidenceValue] = field(default_factory=dict)
    """Inventory and versions: reported, compared for equality, never judged alone."""

    def extend(self, other: "ProbeResult") -> "ProbeResult":
        """Fold ``other`` into this result (in place) and return self."""
        self.findings.extend(other.findings)
        self.figures.update(other.figures)
        self.facts.update(other.facts)
        return self
