"""``runmgr simulate ettr`` as a user runs it: the sweep's table, the best intervals,
where the time went, the restart-cost sweep; bad numbers are one line and exit 2."""

from __future__ import annotations

import json

import pytest

from tests import cli

SMALL = ["--devices", "64", "--days", "10", "--failure-scale", "300", "--warm-spares", "8"]


def test_the_report_compares_both_paths_by_interval_and_restart_cost():
    done = cli.runmgr("simulate", "ettr", *SMALL, "--intervals", "10,50,200", "--restart-scales", "0.5,2")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "64 devices (8 nodes of 8)" in out and "driven by runmgr's controller and policy" in out
    cold = next(line for line in out.splitlines() if line.strip().startswith("today's restart (cold)  "))
    assert len([cell for cell in cold.split() if cell.endswith("%")]) == 3
    assert "best warm restart: ETTR" in out and "Young's interval for the cold path" in out
    assert "restart cost x (at the best intervals)" in out and "ETTR warm" in out

    as_json = json.loads(cli.runmgr("simulate", "ettr", *SMALL, "--intervals", "10,50,200", "--restart-scales",
                                    "0.5,2", "--json").stdout)
    warm_best, cold_best = as_json["best"]["warm"], as_json["best"]["cold"]
    assert warm_best["ettr"] > cold_best["ettr"] and warm_best["warm_restarts"] > 0
    assert f"{cold_best['ettr']:.2%}" in out  # the text and the JSON tell the same run
    scaled = as_json["by_restart_cost"]
    assert [p["scale"] for p in scaled] == [0.5, 2.0] and scaled[0]["cold"] > scaled[1]["cold"]


@pytest.mark.parametrize("args, says", [
    (["--devices", "0"], "devices must be > 0"),
    (["--devices", "12"], "devices (12) must be a multiple of devices_per_node (8)"),
    (["--intervals", "ten"], "--intervals takes comma-separated numbers"),
    (["--restart-scales", "-1"], "--restart-scales: every value must be > 0"),
])
def test_bad_numbers_are_one_line_and_exit_2(args, says):
    done = cli.runmgr("simulate", "ettr", *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
