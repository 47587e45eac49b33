"""What a rule finds: one finding per mistake, with the values that make it one."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning"]
"""``error``: the run would train wrong for sure (``launch`` stops, exit 2);
``warning``: a setting the case reports or OPT-175B's logbook call a mistake (printed
and recorded in the logbook; ``lint.ignore`` silences it on purpose)."""


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on one run config."""

    rule: str
    """The rule's id (``adam-beta2``), the name ``lint.ignore`` takes."""
    severity: Severity
    message: str
    """What is wrong, with the values (``optim.adam_beta2 is 0.999 (>= 0.99)``)."""
    fix: str
    """What to set instead."""
    source: str
    """Where the lesson comes from (runmgr/config/lint.py: a case report or OPT-175B's logbook, in words)."""

    def line(self) -> str:
        """The finding as one line: ``<id> (<severity>): <message>``."""
        return f"{self.rule} ({self.severity}): {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


def errors(findings: list[Finding]) -> list[Finding]:
    """The findings that stop a launch."""
    return [f for f in findings if f.severity == "error"]


def warnings(findings: list[Finding]) -> list[Finding]:
    """The findings that are printed and recorded."""
    return [f for f in findings if f.severity == "warning"]
