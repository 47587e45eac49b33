"""Issue 27, item 4, for real: ``runmgr health-check`` with several Ray nodes on
this one machine while two busy loops take its cores. The nodes' compute
figures then differ by 15-50% from run to run (they compete for the same
cores), which used to exclude healthy nodes as slow. The check must end with
its table, know that the nodes share a machine, and exclude none for speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from health.config import FleetChecks
from health.fleet import HOST_FACT, figure_name
from tests import cli

ROOT = Path(__file__).resolve().parents[3]
FIGURES = set(FleetChecks().higher_is_better) | set(FleetChecks().lower_is_better)


def speed_reasons(report: dict) -> list[str]:
    """Exclusion reasons that are a figure compared with the fleet's (``compute.matmul_tflops 0.05 is ...``)."""
    return [r for reasons in report["excluded"].values() for r in reasons
            if figure_name(r.split(" ", 1)[0]) in FIGURES]


@pytest.mark.slow
def test_nodes_of_one_busy_machine_are_not_excluded_for_speed(tmp_path):
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        result = cli.runmgr("health-check", "cluster.local_nodes=3", "--json", cwd=tmp_path, timeout=540,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert result.returncode in (0, 1), result.stderr[-3000:]  # a table (here JSON), not a crash
    report = json.loads(result.stdout)
    assert report["summary"]["nodes"] == 3
    assert len({entry["report"]["facts"][HOST_FACT] for entry in report["nodes"]}) == 1
    assert "hosts: 3 of 3 nodes share 1 machine(s): speed compared between machines, not within one" \
        in report["notes"]
    assert speed_reasons(report) == [], json.dumps(report["excluded"], indent=1)
