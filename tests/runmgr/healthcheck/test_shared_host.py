"""Issue 27, item 4, for real, as a newcomer meets it: ``runmgr health-check``
with no arguments (the demo's config: a local Ray of three nodes on this one
machine) while two busy loops take its cores. The nodes' compute figures then
differ by 15-50% from run to run (they compete for the same cores), which used
to exclude healthy nodes as slow. The check must end with its readable table,
know that the nodes share a machine, and exclude none for speed.

(One check serves both stories: the newcomer's table, once in
test_command.py, needs no machine of its own, and the busy machine's report is
the one the check stores beside the table, the same JSON ``--json`` prints.)

The loops run from the check's last node-probe line ("[3/3]") to its collectives'
line: while the compute benchmark, which follows every node's other probes,
takes the figures that used to exclude a node, which is what the story is
about; not while Ray and the probes' workers start (a start that runs out of
time on a busy machine: tests/runmgr/test_ray_start_timeout.py), nor through the
collectives, whose members' start (a Ray worker and torch's import each) is most
of their time: loops through it cost about 10 CPU-seconds a run more, taken from
whatever else runs beside. The collectives' one judgement that nodes on one
machine could trip, a slow node, is checked under a real slow node by
tests/runmgr/healthcheck/test_collectives.py::test_on_one_machine_a_slow_node_of_the_collectives_is_warned_not_excluded."""

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


def assert_readable_table(result: subprocess.CompletedProcess, count: int) -> None:
    """The table a person reads: a title, column heads, one row of figures per node, 100 columns at most,
    the fleet's line, what was not checked, and the progress on stderr."""
    table = result.stdout.splitlines()
    assert table[0].startswith("runmgr health-check ") and f"{count} node(s) checked" in table[0]
    assert table[1].split() == ["NODE", "VERDICT", "KEY", "FIGURES", "REASONS"]
    rows = [line for line in table[3:] if line.split()[:1] == [os.uname().nodename]]
    assert len(rows) == count and all("TF/s" in row and "GB/s" in row for row in rows)
    assert all(len(line) <= 100 for line in table)
    assert f"{count} nodes: " in result.stdout
    assert "storage: no shared mount configured" in result.stdout  # says what it did not check
    assert f"probing {count} node(s)" in result.stderr and f"[{count}/{count}]" in result.stderr


def busy_from(marker: str, until: str, args: list[str], cwd: Path, env: dict,
              loops: int = 2) -> subprocess.CompletedProcess:
    """Run ``runmgr *args`` (forked from the tests' CLI fork server: tests/cli.py); from its first
    stderr line that holds ``marker`` until its first later one that holds ``until`` (or its end),
    ``loops`` busy loops take this machine's cores. (pytest's --timeout bounds a stuck command.)"""
    stdout, stderr = cwd / "health-check.stdout", cwd / "health-check.stderr"
    busy: list[subprocess.Popen] = []
    child = cli.start_runmgr(args, cwd, env, stdout, errors=stderr)
    try:
        # The check's own progress on stderr says when it starts and ends measuring.
        before = cli.lines_of(stderr, child, lambda line: marker in line)
        if before and marker in before[-1]:
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
            cli.lines_of(stderr, child, lambda line: until in line, after=len(before))
            stop(busy)
        child.wait()
    finally:
        stop(busy)
        if child.poll() is None:
            child.kill()
            child.wait()
    assert busy, stderr.read_text()[-3000:]  # the figures were taken under load
    return subprocess.CompletedProcess(["runmgr", *args], child.returncode, stdout.read_text(), stderr.read_text())


def stop(loops: list[subprocess.Popen]) -> None:
    for loop in loops:
        if loop.poll() is None:
            loop.kill()
            loop.wait()


@pytest.mark.slow
def test_a_newcomer_on_a_busy_machine_gets_a_readable_table_and_no_node_is_excluded_for_speed(tmp_path):
    # No arguments: the demo's config, a local Ray of three nodes; busy once every node's
    # probes answered ("[3/3]"), through its compute benchmark, until its collectives start.
    result = busy_from("[3/3]", "collectives:", ["health-check"], tmp_path, {**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode in (0, 1), result.stderr[-3000:]  # a table, not a crash (1: some node excluded)
    report = json.loads(next((tmp_path / "runs" / ".health" / "reports").glob("*.json")).read_text())
    assert report["summary"]["nodes"] == 3
    assert_readable_table(result, 3)
    assert len({entry["report"]["facts"][HOST_FACT] for entry in report["nodes"]}) == 1
    assert "hosts: 3 of 3 nodes share 1 machine(s): speed compared between machines, not within one" \
        in report["notes"]
    assert speed_reasons(report) == [], json.dumps(report["excluded"], indent=1)
