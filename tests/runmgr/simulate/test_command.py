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


def parsed(*args: str):
    from runmgr.cli import build_parser

    return build_parser().parse_args(["simulate", "ettr", *args])


def test_thorough_is_the_wide_sweep_over_five_draws_of_the_failures():
    from runmgr.simulate.command import sweep_of

    default, thorough = sweep_of(parsed()), sweep_of(parsed("--thorough", "--seed", "7"))
    assert default.intervals == [10, 25, 50, 100, 200, 400, 800] and default.seeds == [0] and default.lineages == 20
    assert set(default.intervals) < set(thorough.intervals)
    assert {15, 20, 30} < set(thorough.intervals) and max(thorough.intervals) > 800  # around Young's, past 800
    assert min(thorough.scales) == 0.25 and max(thorough.scales) == 8 and 1.0 in thorough.scales
    assert thorough.seeds == [7, 8, 9, 10, 11]
    assert thorough.lineages == 2 * len(thorough.intervals) + 2 * len(thorough.scales) + 2 * 4


@pytest.mark.parametrize("given", [["--intervals", "25"], ["--restart-scales", "1"]])
def test_thorough_beside_the_sweeps_it_sets_is_one_line_and_exit_2(given):
    done = cli.runmgr("simulate", "ettr", "--thorough", *given)
    assert done.returncode == 2, done.stderr
    assert f"--thorough sets {given[0]} itself" in done.stderr and "not both" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "simulated" not in done.stderr


def test_the_other_draws_give_each_paths_best_as_a_range():
    from runmgr.simulate.ettr import EttrResult
    from runmgr.simulate.report import EttrReport, render
    from runmgr.simulate.assumptions import EttrAssumptions

    def result(warm: bool, interval: int, ettr: float) -> EttrResult:
        return EttrResult(warm, interval, ettr, 100.0, ettr * 100, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0)

    by_interval = {False: [result(False, 25, 0.97)], True: [result(True, 800, 0.99)]}
    by_seed = {False: [result(False, 25, e) for e in (0.97, 0.96, 0.98)],
               True: [result(True, 800, e) for e in (0.99, 0.95, 0.99)]}
    report = EttrReport(EttrAssumptions(), 3, 400, by_interval, by_seed=by_seed)
    out = render(report)
    assert "the best intervals over 3 draws of the failures (seeds 3-5):" in out
    assert "today's restart (cold)    ETTR 96.00% to 98.00% (mean 97.00%) with a checkpoint every 25 steps" in out
    assert "warm restart              ETTR 95.00% to 99.00% (mean 97.67%) with a checkpoint every 800 steps" in out
    assert report.to_dict()["by_seed"] == {"cold": [0.97, 0.96, 0.98], "warm": [0.99, 0.95, 0.99]}
