"""Detectors are pure: no clock, no I/O, no Ray; from the trainer only its report and plan types.
Parsing a timestamp (datetime.fromisoformat) is pure and allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "runmgr" / "watch"
IMPURE = {"time", "datetime.datetime.now", "os", "io", "socket", "subprocess", "pathlib", "threading",
          "asyncio", "ray", "health", "logbook", "random"}
ALLOWED_TRAINER = {"trainer.report", "trainer.plan"}
PURE_HEALTH = "health.parsers"
"""The vendor tools' text parsers: pure functions of a tool's output (device_readings.py reads with them)."""


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_detectors_import_no_clock_no_io_and_only_the_trainers_contract_types():
    offenders = {}
    for path in sorted(PACKAGE.glob("*.py")):
        found = imports(path)
        bad = {n for n in found if n.split(".")[0] in IMPURE and not n.startswith(PURE_HEALTH)}
        bad |= {n for n in found if n.split(".")[0] == "trainer" and n not in ALLOWED_TRAINER}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_no_detector_reads_the_wall_clock():
    for path in sorted(PACKAGE.glob("*.py")):
        text = path.read_text()
        assert "time.time(" not in text and "monotonic(" not in text and ".now(" not in text, path.name
