"""``policy.act_on=[restart]`` on a real launch: a real loss spike (garbage data) is a rollback held
for a person, the webhook on 127.0.0.1 is told, ``runmgr approve`` carries it out, and the logbook
says who approved. The ranks wait at a pause past the spike, so the answer reaches the driver
before the run could finish, and are let go once the driver took it (no race with the machine's
speed). On a Ray of its own: on the session's, late in two clean-clone runs of the suite, this
launch's node agents were cancelled before they ran, at every retry (not understood yet)."""

from __future__ import annotations

import getpass
import os

from tests import cli
from tests.e2e.harness import ROOT, LaunchedRun, runmgr_json_lines
from tests.webhook import receiver  # noqa: F401 (a fixture)

# The demo's model and data: garbage from step 45 for 12 (over the demo watcher's 10-step grace).
FAULTS = "chaos.faults=[{kind: garbage_data, at_step: 45, steps: 12}, {kind: pause_at_step, at_step: 62}]"


def test_a_held_rollback_is_told_approved_from_the_cli_and_carried_out(tmp_path, receiver):
    base = ["chaos=garbage_data", FAULTS, "watcher=demo", "policy=demo", "health.skip=true", "policy.act_on=[restart]",
            "cluster.local_nodes=1", "training.train_iters=80", "checkpoint.save_interval=10",
            "notify.webhook=env:RUNMGR_TEST_HOOK", "notify.backoff_s=0.05"]
    run = LaunchedRun(tmp_path / "held", base=base, env={**os.environ, "RUNMGR_TEST_HOOK": receiver.url}).start()
    status = run.wait_for(lambda s: s["state"] == "awaiting_approval", timeout=300, what="the held rollback")
    assert status["awaiting"]["action"] == "rollback_skip" and "loss_spike" in status["awaiting"]["incident"]
    shown = cli.runmgr("status", str(run.run_dir), cwd=ROOT)
    assert "waiting for a person: runmgr would rollback_skip" in shown.stdout, shown.stdout + shown.stderr
    (told,) = receiver.wait_for(1)
    assert told["kind"] == "recommendation" and "waiting for a person" in told["text"]
    approved = cli.runmgr("approve", str(run.run_dir), cwd=ROOT)
    assert approved.returncode == 0 and "approved rollback_skip" in approved.stdout, approved.stderr
    # Once the driver took the answer (the rolled-back sub-run is on), the pause may let go.
    run.wait_for(lambda s: s["subrun"] != status["subrun"], what="the approved rollback's sub-run")
    run.release(62, index=1)
    assert run.wait(timeout=300) == 0, run.output()[-3000:]

    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    (held,) = [e for e in events if e["type"] == "decision" and e["action"] == "rollback_skip"]
    assert held["plan"]["awaits_approval"] and "held for a person" in held["reason"]
    (approval,) = [e for e in events if e["type"] == "event" and e["kind"] == "approved"]
    assert approval["data"]["by"] == getpass.getuser() and approval["seq"] > held["seq"]
    rolled_back = next(e for e in events if e["type"] == "subrun_start" and e["seq"] > approval["seq"])
    assert rolled_back["start_step"] <= 35 and rolled_back["plan"]["skip_ranges"]
    ends = [e for e in events if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == 80
    assert receiver.url not in str(events) + run.output()
    # Nothing is held any more: an answer now is one line, exit 2.
    late = cli.runmgr("decline", str(run.run_dir), cwd=ROOT)
    assert late.returncode == 2 and "holds no remedy for a person" in late.stderr and late.stderr.count("\n") == 1
