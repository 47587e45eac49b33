"""The rules of ``runmgr lint`` by id: the table's entries (runmgr/config/lint.py: each
rule's id, severity, what it checks and where the lesson comes from, what docs/lint.md
lists and ``lint.ignore`` names) with the finding each makes. The checks live beside
this (config_rules, data, checkpoint, versions, remedies)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from runmgr.config.lint import RULE_TABLE, RuleEntry
from runmgr.lint.findings import Finding


@dataclass(frozen=True)
class Rule(RuleEntry):
    """One check of ``runmgr lint``: its table entry, and the finding it makes."""

    def finding(self, message: str, fix: str) -> Finding:
        """This rule's finding, with the values in ``message``."""
        return Finding(self.id, self.severity, message, fix, self.source)


RULES: dict[str, Rule] = {entry.id: Rule(**asdict(entry)) for entry in RULE_TABLE}
"""Every rule by id, in the order they are checked (runmgr/config/lint.py's table)."""
