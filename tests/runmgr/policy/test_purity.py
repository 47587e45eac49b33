"""The policy is pure: no clock, no I/O, no Ray; from the trainer only its plan type."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "runmgr" / "policy"
IMPURE = {"time", "datetime", "os", "io", "socket", "subprocess", "pathlib", "threading", "asyncio", "ray",
          "health", "logbook", "random"}


def test_the_policy_imports_no_clock_no_io_and_only_the_plan_from_the_trainer():
    offenders = {}
    for path in sorted(PACKAGE.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
        bad = {n for n in found if n.split(".")[0] in IMPURE}
        bad |= {n for n in found if n.split(".")[0] == "trainer" and n != "trainer.plan"}
        bad |= {n for n in found if n == "runmgr.watch.replay"}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}
