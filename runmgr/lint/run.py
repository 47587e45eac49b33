"""Run the rules on one run config and apply ``lint.ignore``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from runmgr.config.schema import RunConfig
from runmgr.lint.checkpoint import check_checkpoint
from runmgr.lint.config_rules import check_config
from runmgr.lint.data import check_data, read_sample
from runmgr.lint.effective import effective_config
from runmgr.lint.findings import Finding, errors, warnings
from runmgr.lint.remedies import check_remedies
from runmgr.lint.versions import software_versions


@dataclass(frozen=True)
class LintResult:
    """The findings that stand, and what ``lint.ignore`` silenced."""

    findings: tuple[Finding, ...]
    """Every finding not silenced, in the rules table's order."""
    ignored: tuple[str, ...] = ()
    """The rule ids of ``lint.ignore``."""
    silenced: tuple[Finding, ...] = field(default=())
    """The findings those ids silenced."""

    @property
    def errors(self) -> list[Finding]:
        return errors(list(self.findings))

    @property
    def warnings(self) -> list[Finding]:
        return warnings(list(self.findings))

    def evidence(self) -> dict:
        """What the logbook keeps: each warning, and each ignored rule with what it silenced."""
        silenced = {f.rule: f for f in self.silenced}
        return {"warnings": [f.to_dict() for f in self.warnings],
                "ignored": [{"rule": rule, "silenced": silenced[rule].to_dict() if rule in silenced else None}
                            for rule in self.ignored]}


def merged(first: LintResult, second: LintResult) -> LintResult:
    """Two results of the same config (before launch, after the health gate) as one."""
    return LintResult(first.findings + second.findings, first.ignored, first.silenced + second.silenced)


def apply_ignore(findings: list[Finding], ignored: tuple[str, ...]) -> LintResult:
    """Split ``findings`` into those that stand and those ``ignored`` silences."""
    return LintResult(tuple(f for f in findings if f.rule not in ignored), ignored,
                      tuple(f for f in findings if f.rule in ignored))


def reads_config_data(config: RunConfig) -> bool:
    """True when the ranks read ``config.data`` through the trainer's data path (not a
    Megatron job's own ``--data-path`` and loader)."""
    return not config.job_describes_itself


def lint_config(config: RunConfig) -> LintResult:
    """Every rule that needs no cluster: the config, the checkpoint it starts from, the data."""
    findings = check_config(effective_config(config)) + check_checkpoint(config) + check_remedies(config)
    if reads_config_data(config):
        findings += check_data(read_sample(config), config.model.vocab_size)
    return apply_ignore(findings, config.lint.ignored())


def lint_health(config: RunConfig, report: Mapping) -> LintResult:
    """The rule that needs the health check's report (software versions across the nodes)."""
    finding = software_versions(report)
    return apply_ignore([finding] if finding is not None else [], config.lint.ignored())
