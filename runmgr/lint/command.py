"""``runmgr lint conf=NAME [key=value ...]``: every rule on a composed config,
without launching. The software-versions rule reads the newest stored health
check (``runmgr health-check`` writes it); without one it is not checked."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO

from runmgr.config.schema import RunConfig
from runmgr.errors import UserError
from runmgr.healthcheck.gate import store_for
from runmgr.lint.findings import Finding

if TYPE_CHECKING:
    from runmgr.lint.run import LintResult

EXIT_ERRORS = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    lint = sub.add_parser("lint", help="check a config, its data and its checkpoint for the mistakes that a "
                                       "LLaMA2-70B NPU case, a precision-tuning guide and OPT-175B's logbook "
                                       "name (docs/lint.md)")
    lint.add_argument("items", nargs="*", metavar="conf=NAME key=value", help="the config and its overrides")
    lint.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    lint.add_argument("--json", action="store_true", help="one JSON object per finding")
    lint.set_defaults(func=cmd_lint)


def cmd_lint(args: argparse.Namespace) -> int:
    # Imported here: the rules reach torch (the checkpoint rule's model shapes), which
    # every other runmgr command would otherwise pay for at start (~2 s).
    from runmgr.lint.run import lint_config, lint_health, merged

    conf = [item for item in args.items if item.startswith("conf=")]
    if len(conf) != 1:
        raise UserError("name exactly one config, e.g. `runmgr lint conf=llama2_70b` (the names are conf/*.yaml)")
    overrides = [item for item in args.items if not item.startswith("conf=")]
    config = load(conf[0].split("=", 1)[1], overrides, args.config_dir)
    result = lint_config(config)
    health = latest_health_report(config)
    if health is not None:
        result = merged(result, lint_health(config, health))
    (print_json if args.json else print_text)(result, sys.stdout, health is not None)
    return EXIT_ERRORS if result.errors else 0


def load(conf: str, overrides: list[str], conf_dir: Optional[Path]) -> RunConfig:
    """The config as ``launch`` reads it (a Megatron job's numbers from its arguments)."""
    from runmgr.config.compose import load_run_config
    from runmgr.megatron.job import aligned

    config = load_run_config(conf, overrides, conf_dir)
    return aligned(config)


def latest_health_report(config: RunConfig) -> Optional[dict]:
    """The JSON report of the newest health check stored beside the run directories."""
    checks = [c for c in store_for(config).checks() if c.report]
    if not checks:
        return None
    try:
        return json.loads(Path(checks[-1].report).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def print_text(result: LintResult, out: TextIO, versions_checked: bool) -> None:
    for finding in result.findings:
        out.write(block(finding))
    for rule in result.ignored:
        fired = any(f.rule == rule for f in result.silenced)
        out.write(f"ignored   {rule} (lint.ignore){': it would have fired' if fired else ''}\n")
    counts = f"{len(result.errors)} error(s), {len(result.warnings)} warning(s)"
    out.write(f"{counts}" if result.findings else "no findings")
    if not versions_checked:
        out.write(" (software-versions not checked: no stored health check; run `runmgr health-check`)")
    out.write("\n")


def block(finding: Finding) -> str:
    """One finding: id and severity, the finding with its values, the fix, the source."""
    return (f"{finding.rule:<24} {finding.severity}\n"
            f"  finding: {finding.message}\n"
            f"  fix:     {finding.fix}\n"
            f"  source:  {finding.source}\n")


def print_json(result: LintResult, out: TextIO, versions_checked: bool) -> None:
    for finding in result.findings:
        out.write(json.dumps(finding.to_dict(), sort_keys=True) + "\n")
    for finding in result.silenced:
        out.write(json.dumps({**finding.to_dict(), "ignored": True}, sort_keys=True) + "\n")
