"""A requested stop is not a crash: SIGTERM (what a scheduler or Kubernetes
sends) and Ctrl-C's SIGINT to `runmgr launch` stop the run cleanly, record the
sub-run as ``stopped by signal ...``, print no traceback and no Ray crash
dump, and the same command again resumes it, bit for bit.

One lineage on real processes: the ranks pause after step 15 (chaos
pause_at_step), the driver gets SIGTERM; the relaunch resumes from checkpoint
10 and pauses after step 25, the driver gets SIGINT; the third launch
finishes. Its kept losses are the uninterrupted run's, float for float.

The first launch has a Ray of its own, so that a signal's stop is seen once with
the local Ray the driver started and must take down quietly; a signal stops the
run the way it stops itself (nothing is killed, the cluster is not
reconfigured), so the relaunches run on the session's shared Ray instead of
starting one each."""

from __future__ import annotations

import json
import signal

import pytest

from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from tests.e2e.harness import LaunchedRun, kept_losses, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow

PAUSES = [(0, 15), (1, 25)]
"""(index in the schedule, step): where the ranks wait for the test."""
SCHEDULE = "chaos.faults=[" + ", ".join(f"{{kind: pause_at_step, at_step: {step}}}" for _, step in PAUSES) + "]"
CRASH_DUMP_MARKS = ("Traceback", "received at time=", "PC: @", "*** SIG", "\x1b[")
"""What a crash prints: Python's traceback, the native failure handler's dump (absl: '*** SIGTERM
received at time=...', 'PC: @ 0x...'), and Ray's coloured log lines."""


def wait_paused(run: LaunchedRun, index: int, step: int) -> None:
    """Until every rank has finished ``step`` and waits there, and the lineage recorded the pause."""
    label = f"{index}:pause_at_step@{step}"
    status = run.wait_for(lambda s: s["state"] == "running" and bool(s["workers"])
                          and s.get("paused_ranks") == sorted(w["rank"] for w in s["workers"])
                          and ChaosState(run.run_dir).has_fired(label),
                          timeout=300, what=f"every rank paused after step {step}")
    assert status["step"] == step, status


def stop_at_pause(run: LaunchedRun, index: int, step: int, signum: int) -> str:
    """Send ``signum`` to the driver while the ranks wait after ``step``; its whole output."""
    wait_paused(run, index, step)
    run.proc.send_signal(signum)
    assert run.wait() == 128 + signum, run.output()[-3000:]
    release_file(run.run_dir, f"{index}:pause_at_step@{step}").touch()  # nothing waits any more; tidy
    return run.output()


def test_sigterm_and_sigint_stop_cleanly_and_the_relaunch_resumes_bit_for_bit(tmp_path, reference_losses,
                                                                             shared_ray):
    run_dir = tmp_path / "stopped"
    on_shared_ray = [SCHEDULE, f"cluster.address={shared_ray.address}"]
    outputs = {}
    for (index, step), signum, extra in zip(PAUSES, (signal.SIGTERM, signal.SIGINT), ([SCHEDULE], on_shared_ray)):
        run = LaunchedRun(run_dir, extra=extra).start()  # the same command each time (but for the cluster)
        name = signal.Signals(signum).name
        outputs[name] = output = stop_at_pause(run, index, step, signum)
        assert f"stopped by signal {name}: sub-run 1.0{index} at step {step}" in output
        assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
        run.log.unlink()  # each launch's output on its own
    finished = LaunchedRun(run_dir, extra=on_shared_ray).start()
    assert finished.wait() == 0, finished.output()[-3000:]

    for name, output in outputs.items():
        assert not [mark for mark in CRASH_DUMP_MARKS if mark in output], (name, output[-3000:])
    ends = {e["subrun"]: e for e in runmgr_json_lines("logbook", "events", str(run_dir), "--json")
            if e["type"] == "subrun_end"}
    assert [(s, e["end_state"], e["last_step"], e["reason"]) for s, e in sorted(ends.items())] == [
        ("1.00", "stopped", 15, "stopped by signal SIGTERM"),
        ("1.01", "stopped", 25, "stopped by signal SIGINT"),
        ("1.02", "finished", 40, "trained to step 40"),
    ]
    assert kept_losses(run_dir) == reference_losses  # exact float equality, every step
    timeline = runmgr_text("logbook", "show", str(run_dir))
    assert "stopped at step 15 — stopped by signal SIGTERM" in timeline
    assert "abandoned" not in timeline and "crash" not in timeline
