"""What ``runmgr launch`` (and ``--dry-run``) does with the lint: an error stops
it with one line before anything is written or started; warnings are printed,
and the launch keeps them (:meth:`LintResult.evidence`) for the logbook."""

from __future__ import annotations

from typing import Mapping, TextIO

from runmgr.config.schema import RunConfig
from runmgr.errors import ConfigError
from runmgr.lint.findings import Finding
from runmgr.lint.run import LintResult, lint_config, lint_health


class LintError(ConfigError):
    """A lint rule of severity error fired: the run would train wrong."""


def error_line(found: list[Finding]) -> str:
    """The one line a launch stops with (the CLI prefixes ``runmgr: error:``)."""
    first = found[0]
    more = f" (and {len(found) - 1} more: {', '.join(f.rule for f in found[1:])})" if len(found) > 1 else ""
    return f"lint error {first.rule}: {first.message}; fix: {first.fix} [{first.source}]{more}"


def warning_line(finding: Finding) -> str:
    return f"lint warning {finding.rule}: {finding.message}; fix: {finding.fix} [{finding.source}]"


def stop_on_errors(result: LintResult) -> LintResult:
    """Raise :class:`LintError` on errors, else hand the result on (its warnings unprinted)."""
    if result.errors:
        raise LintError(error_line(result.errors))
    return result


def report(result: LintResult, out: TextIO) -> LintResult:
    """Raise :class:`LintError` on errors; print each warning and each ignored rule."""
    stop_on_errors(result)
    print_findings(result, out)
    return result


def print_findings(result: LintResult, out: TextIO) -> None:
    """Each warning and each ignored rule, one line each."""
    for finding in result.warnings:
        out.write(warning_line(finding) + "\n")
    for rule in result.ignored:
        silenced = any(f.rule == rule for f in result.silenced)
        out.write(f"lint ignored {rule} (lint.ignore){': it fired' if silenced else ''}\n")
    out.flush()


def lint_before_launch(config: RunConfig) -> LintResult:
    """The config, checkpoint and data rules, before any run directory or Ray exists: an
    error raises; the warnings are printed by the caller (:func:`print_findings`) once the
    launch's other refusals have passed, so that a refused launch prints one line only."""
    return stop_on_errors(lint_config(config))


def lint_after_health(config: RunConfig, health_report: Mapping, out: TextIO) -> LintResult:
    """The software-versions rule, once the health gate has its report (ignored ids not repeated)."""
    result = lint_health(config, health_report)
    return report(LintResult(result.findings, (), result.silenced), out)
