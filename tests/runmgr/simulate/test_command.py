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


def test_each_simulated_lineage_is_a_progress_line_and_the_text_is_on_stdout_alone():
    done = cli.runmgr("simulate", "ettr", *SMALL, "--intervals", "10,50", "--restart-scales", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"simulated {n}/6" for n in range(1, 7)]
    assert lines[0].startswith("simulated 1/6: cold restarts, a checkpoint every 10 steps (")
    assert lines[-1].startswith("simulated 6/6: warm restarts at 1 x their cost (") and "about 0 s left" in lines[-1]
    assert "simulated" not in done.stdout


def test_the_failures_drawn_and_those_met_are_told_apart_and_a_losing_warm_path_says_so():
    # 512 devices: ten failures in the job's time, too few for a snapshot every step to pay.
    done = cli.runmgr("simulate", "ettr", "--devices", "512", "--intervals", "25,100,400", "--restart-scales", "")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "46 drawn (seed 0) over 4 x the failure-free span" in out and "(the fail column)" in out
    fail = [line.split()[-4] for line in out.splitlines() if line.strip().startswith(("today's restart (cold)  ",
                                                                                      "warm restart  "))][-2:]
    assert fail == ["10", "10"]
    assert "choose the cold path here (controller.warm_spares=0): the warm path's snapshots take 5.2 h" in out


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
