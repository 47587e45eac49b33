"""Bad input is one line naming the problem, exit code 2, no traceback; and
``--dry-run`` tells the truth about the 175B plan on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def runmgr(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runmgr", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["conf=demo", "training.bogus=1"], "unknown config key 'training.bogus'"),
        (["conf=demo", "training.train_iters=many"], "training.train_iters"),
        (["conf=demo", "model.hidden_size=-8"], "model.hidden_size must be a positive integer"),
        (["conf=demo", "training.global_batch_size=12"], "must be divisible by micro_batch_size x data-parallel size"),
        (["conf=demo", "data.data_path=/nonexistent/corpus"], "/nonexistent/corpus"),
        (["conf=nosuchconf"], "unknown conf 'nosuchconf'"),
        (["conf=demo", "cluster.address=127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
        (["conf=demo", "model=nosuchmodel"], "unknown model 'nosuchmodel'"),
        (["run.name=x"], "name exactly one config"),
        (["conf=demo", "training.train_iters"], "write overrides as key=value"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, expected, tmp_path):
    result = runmgr("launch", *args, f"run.dir={tmp_path / 'run'}")
    assert_one_line_error(result, expected)
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_an_unknown_subcommand_is_one_line():
    assert_one_line_error(runmgr("lanch", "conf=demo"), "invalid choice")


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_dry_run_of_run12_prints_the_175b_plan_and_says_it_cannot_run_here():
    result = runmgr("launch", "conf=run12", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "world size 992 = TP 8 x PP 1 x DP 124" in out
    params = int(out.split("parameters")[1].split("(")[0].replace(",", "").strip())
    assert 170e9 < params < 180e9
    assert "GiB per cuda device" in out
    assert "CANNOT run on the cluster in view" in out and "992" in out


def test_dry_run_of_the_demo_fits_this_machine():
    result = runmgr("launch", "conf=demo", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "accumulation 2" in result.stdout and "fits" in result.stdout


def test_status_of_an_unknown_run_is_one_line(tmp_path):
    assert_one_line_error(runmgr("status", "nosuchrun", "--json", cwd=tmp_path), "no run 'nosuchrun'")


def test_watch_replay_of_a_megatron_log_with_a_spike_prints_the_incident_and_the_decision():
    fixtures = ROOT / "tests" / "runmgr" / "watch" / "fixtures"
    spiky = runmgr("watch", "replay", str(fixtures / "megatron_spike.log"))
    assert spiky.returncode == 0, spiky.stderr
    assert "loss_spike at step 4211" in spiky.stdout and "-> rollback_skip" in spiky.stdout
    clean = runmgr("watch", "replay", str(fixtures / "megatron_clean.log"))
    assert clean.returncode == 0, clean.stderr
    assert "no incidents" in clean.stdout and "->" not in clean.stdout


def test_watch_replay_of_a_missing_file_is_one_line():
    assert_one_line_error(runmgr("watch", "replay", "/nonexistent/train.log"), "/nonexistent/train.log")
