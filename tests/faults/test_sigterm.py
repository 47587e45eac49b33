"""A requested stop is not a crash: SIGTERM (what a scheduler or Kubernetes
sends) to `runmgr launch` stops the run cleanly, records the sub-run as
``stopped by signal SIGTERM``, prints no traceback and no Ray crash dump, and
the same command again resumes it, bit for bit.

One lineage on real processes: the ranks pause after step 15 (chaos
pause_at_step), the driver gets SIGTERM; the relaunch resumes from checkpoint
10 and finishes. Its kept losses are the uninterrupted run's, float for float.

The first launch has a Ray of its own, so that a signal's stop is seen with the
local Ray the driver started and must take down quietly; a signal stops the run
the way it stops itself (nothing is killed, the cluster is not reconfigured),
so the relaunch runs on the session's shared Ray. Ctrl-C's SIGINT, the same
stop on the shared Ray, is tests/faults/test_s3_mirror.py's (its story's driver
is stopped with it before its relaunch from S3)."""

from __future__ import annotations

import json
import signal

import pytest

from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from tests.e2e.harness import CRASH_DUMP_MARKS, LaunchedRun, kept_losses, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow

PAUSE_STEP = 15
PAUSE_LABEL = f"0:pause_at_step@{PAUSE_STEP}"
SCHEDULE = f"chaos.faults=[{{kind: pause_at_step, at_step: {PAUSE_STEP}}}]"


def stop_at_pause(run: LaunchedRun, signum: int) -> str:
    """Send ``signum`` to the driver while every rank waits after step 15; its whole output."""
    status = run.wait_for(lambda s: s["state"] == "running" and bool(s["workers"])
                          and s.get("paused_ranks") == sorted(w["rank"] for w in s["workers"])
                          and ChaosState(run.run_dir).has_fired(PAUSE_LABEL),
                          timeout=300, what=f"every rank paused after step {PAUSE_STEP}")
    assert status["step"] == PAUSE_STEP, status
    run.proc.send_signal(signum)
    assert run.wait() == 128 + signum, run.output()[-3000:]
    release_file(run.run_dir, PAUSE_LABEL).touch()  # nothing waits any more; tidy
    return run.output()


def test_sigterm_stops_cleanly_and_the_relaunch_resumes_bit_for_bit(tmp_path, reference_losses, shared_ray):
    run_dir = tmp_path / "stopped"
    output = stop_at_pause(LaunchedRun(run_dir, extra=[SCHEDULE]).start(), signal.SIGTERM)
    assert "stopped by signal SIGTERM: sub-run 1.00 at step 15" in output
    assert not [mark for mark in CRASH_DUMP_MARKS if mark in output], output[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    # The same command again (but for the cluster).
    finished = LaunchedRun(run_dir, extra=[SCHEDULE, f"cluster.address={shared_ray.address}"]).start()
    assert finished.wait() == 0, finished.output()[-3000:]

    ends = {e["subrun"]: e for e in runmgr_json_lines("logbook", "events", str(run_dir), "--json")
            if e["type"] == "subrun_end"}
    assert [(s, e["end_state"], e["last_step"], e["reason"]) for s, e in sorted(ends.items())] == [
        ("1.00", "stopped", 15, "stopped by signal SIGTERM"),
        ("1.01", "finished", 40, "trained to step 40"),
    ]
    assert kept_losses(run_dir) == reference_losses  # exact float equality, every step
    timeline = runmgr_text("logbook", "show", str(run_dir))
    assert "stopped at step 15 — stopped by signal SIGTERM" in timeline
    assert "abandoned" not in timeline and "crash" not in timeline
