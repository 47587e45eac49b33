"""``runmgr logbook compare`` on small logbooks written through the logbook's own API:
the text (config diff, rows, verdict), ``--json``, ``--plot`` (PNG and HTML), and a
missing run or a bad option as one line with exit code 2."""

import json
import math
import subprocess
from pathlib import Path

import pytest

from logbook import Logbook
from tests import cli

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30


def write_run(run_dir: Path, wiggle: float = 0.0, drift_from: int | None = None, weight_decay: float = 0.1,
              micro_batch: int = 4, phase: float = 0.0, data_parallel: int = 2) -> Path:
    """A finished one-sub-run logbook: a falling loss plus ``wiggle`` noise, plus a growing
    difference from step ``drift_from``; the grad norm follows the same pattern."""
    config = {"run": {"name": run_dir.name, "dir": str(run_dir)},  # differ between any two runs: not in the diff
              "optim": {"lr": 3e-3, "weight_decay": weight_decay}, "training": {"micro_batch_size": micro_batch}}
    rows = []
    for step in range(1, STEPS + 1):
        noise = wiggle * math.sin(1.7 * step + phase)
        drift = 1e-3 * (step - drift_from + 1) if drift_from is not None and step >= drift_from else 0.0
        rows.append({"step": step, "loss": 3.0 / (1 + step / 7) + noise + drift, "grad_norm": 1.0 + noise - drift,
                     "lr": 3e-3, "loss_scale": 1.0, "tokens": 1024, "step_time": 0.1, "time": 1000.0 + step})
    with Logbook.open(run_dir) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {"data_parallel_size": data_parallel}, config)
        book.record_metrics("1.00", rows)
        book.end_subrun("1.00", "finished", STEPS, None)
    return run_dir


def runmgr(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return cli.runmgr("logbook", "compare", *args, cwd=cwd, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """runs/ref, runs/same (a copy), runs/wd (weight decay 0: drifts from step 8),
    runs/c and runs/d (the baseline pair: noise 1e-4), runs/mb (micro batch 2: noise 3e-5),
    runs/shrunk (its plan's data parallel 1, the config unchanged: noise 3e-5)."""
    cwd = tmp_path_factory.mktemp("compare")
    write_run(cwd / "runs" / "ref")
    write_run(cwd / "runs" / "same")
    write_run(cwd / "runs" / "wd", weight_decay=0.0, drift_from=8)
    write_run(cwd / "runs" / "c", wiggle=1e-4)
    write_run(cwd / "runs" / "d", wiggle=1e-4, phase=3.0)
    write_run(cwd / "runs" / "mb", wiggle=3e-5, phase=1.0, micro_batch=2)
    write_run(cwd / "runs" / "shrunk", wiggle=3e-5, phase=2.0, data_parallel=1)
    return cwd


def test_a_layout_the_plan_changed_is_in_the_diff(runs):
    """Issue 32: a remedy that shrank data parallel 2 -> 1 left the config as it was, and the
    diff said "none" about what made the runs differ."""
    result = runmgr(runs, "ref", "shrunk")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2:4] == ["config diff (ref -> shrunk):", "  plan.data_parallel_size: 2 -> 1"], lines[:5]


def test_the_same_run_twice_is_identical(runs):
    result = runmgr(runs, "ref", "same")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "verdict: identical"
    assert "config diff (ref -> same): none" in lines


def test_a_changed_weight_decay_is_named_and_diverges_where_it_leaves_the_band(runs):
    result = runmgr(runs, "ref", "wd", "--baseline", "c", "d")
    assert result.returncode == 0, result.stderr
    assert "  optim.weight_decay: 0.1 -> 0.0" in result.stdout
    assert result.stdout.splitlines()[-1] == "verdict: diverging from step 8"
    row = next(line for line in result.stdout.splitlines() if line.split("|")[0].strip() == "8")
    assert row.count("*") == 2  # both metrics outside the band at step 8


def test_noise_inside_the_baseline_band_is_consistent(runs):
    result = runmgr(runs, "ref", "mb", "--baseline", "c", "d")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "verdict: consistent"
    assert "baseline config diff (c -> d): none" in result.stdout


def test_without_a_baseline_a_difference_is_only_different(runs):
    result = runmgr(runs, "ref", "wd")
    assert result.stdout.splitlines()[-1] == "verdict: different from step 8"


def test_json_is_one_object_with_the_rows_and_the_verdict(runs):
    result = runmgr(runs, "ref", "wd", "--baseline", "c", "d", "--json")
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    data = json.loads(line)
    assert (data["verdict"], data["kind"], data["step"]) == ("diverging from step 8", "diverging", 8)
    assert data["config_diff"] == {"optim.weight_decay": [0.1, 0.0]}
    loss = data["metrics"]["loss"]
    assert loss["steps"] == list(range(1, STEPS + 1)) and len(loss["band"]) == STEPS
    assert loss["diff"][7] == pytest.approx(1e-3) and loss["outside"][7] and not loss["outside"][6]


def test_plot_writes_the_png_and_the_html(runs):
    png = runmgr(runs, "ref", "wd", "--baseline", "c", "d", "--plot", "out/diff.png")
    assert png.returncode == 0, png.stderr
    assert png.stdout.splitlines()[-1] == "plot: out/diff.png"
    assert (runs / "out" / "diff.png").read_bytes()[:4] == b"\x89PNG"
    html = runmgr(runs, "ref", "mb", "--baseline", "c", "d", "--plot", "diff.html", "--json")
    assert json.loads(html.stdout)["plot"] == "diff.html"
    page = (runs / "diff.html").read_text(encoding="utf-8")
    assert "<html" in page.lower() and "consistent" in page


@pytest.mark.parametrize("args, says", [
    (["ref", "nosuch"], "no run 'nosuch'"),
    (["ref", "wd", "--baseline", "c", "nosuch"], "no run 'nosuch'"),
    (["ref"], "runmgr logbook compare: error: the following arguments are required: RUN_B"),
    (["ref", "wd", "--plot", "diff.svg"], "must end in .png or .html"),
    (["ref", "wd", "--metric", "loss"],
     "runmgr logbook compare: error: unrecognized arguments: --metric loss; --metric is for `runmgr logbook plot`"),
])
def test_bad_input_is_one_line_and_exit_2(runs, args, says):
    result = runmgr(runs, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and says in result.stderr, result.stderr
    assert not (runs / "diff.svg").exists()


def test_other_actions_refuse_a_second_run_and_the_compare_options(runs):
    for args, says in ((["show", "ref", "wd"], "unrecognized arguments: wd"),
                       (["show", "ref", "--baseline", "c", "d"],
                        "unrecognized arguments: --baseline c d; --baseline is for `runmgr logbook compare`")):
        # Its own process with a bare environment, forked from the session's CLI fork server (tests/cli.py).
        result = cli.runmgr("logbook", *args, cwd=runs, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""})
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"runmgr logbook show: error: {says}"), result.stderr
