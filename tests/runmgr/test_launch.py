"""``runmgr launch`` stopped by a person: Ctrl-C (SIGINT) or a scheduler's
SIGTERM is a clean stop, recorded in the logbook as such, not a crash."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logbook import Logbook

ROOT = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 300  # a bound for a loaded machine, not a timing the test relies on


def wait_for_step(run_dir: Path, proc: subprocess.Popen, step: int) -> None:
    """Until the driver's own status file shows ``step`` trained."""
    deadline = time.monotonic() + START_DEADLINE_S
    status = run_dir / "status.json"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if status.is_file():
            try:
                if json.loads(status.read_text()).get("step", 0) >= step:
                    return
            except json.JSONDecodeError:
                pass  # never half-written (atomic replace); a reader of an old name sees it whole
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the run did not reach step {step}: {proc.communicate()}")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_is_recorded_as_a_clean_stop(tmp_path, signum):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runmgr", "launch", "conf=demo", "chaos=none", "health.skip=true",
         "cluster.local_nodes=1", "training.train_iters=5000", f"run.dir={run_dir}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(run_dir, proc, 3)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in out + err and "\x1b[" not in out + err
    assert f"stopped by signal {name}: sub-run 1.00 at step" in out
    with Logbook.open(run_dir, create=False) as book:
        (subrun,) = book.lineage()
    assert subrun.end_state == "stopped" and subrun.end_reason == f"stopped by signal {name}"
    assert subrun.last_step >= 3
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    show = subprocess.run([sys.executable, "-m", "runmgr", "logbook", "show", str(run_dir)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert f"stopped at step {subrun.last_step} — stopped by signal {name}" in show.stdout
    assert "abandoned" not in show.stdout and "crash" not in show.stdout
