"""One lineage, two stories a person meets (issue 28: one launch where there were two).

A user's mistake in the config (chaos=lr_blowup: the peak LR 1000x too high, reached at step 120)
makes the loss really diverge. ``policy.act_on=[restart, lower_lr]`` holds the first remedy, the
rollback, for a person: the webhook on 127.0.0.1 is told, ``runmgr approve`` from the CLI is taken by
the live driver and carried out, and the logbook says who approved. Rolling back alone does not cure
a bad LR: the re-run diverges again and the ladder lowers the LR for good (taken by itself), which
gets the run to its end. The ranks wait at a pause on the last step but one, so the answer reaches
the driver before the run could finish, and are let go once the driver took it (no race with the
machine's speed; the answer comes long before they get there). On a Ray of its own: on the
session's, late in two clean-clone runs of the suite, the approval's launch had its node agents
cancelled before they ran, at every retry (not understood yet)."""

from __future__ import annotations

import getpass
import os

import pytest

from runmgr.config.compose import load_run_config
from tests import cli
from tests.e2e.harness import ROOT, LaunchedRun, runmgr_json_lines
from tests.e2e.test_closed_loop import incident_of, next_subrun_start
from tests.webhook import Receiver

pytestmark = pytest.mark.slow

# The demo's schedule to step 160, not 200: the LR's mistake is the same (a constant LR after its
# ramp to step 120, whatever the run's length), and the run still trains past the divergence at the
# cut LR. Training is deterministic, so where it diverges is the same on every try on one machine.
TRAIN_ITERS = 160
PAUSE = TRAIN_ITERS - 1
# The demo's model at half its width over half its tokens (about a fifth of its FLOPs a step:
# 42 -> 22 CPU-s for this module, stop 57). That model tolerates more than the demo's: the
# schedule's 300x (conf/chaos/lr_blowup.yaml, measured on the demo's model) only wandered at loss
# 3.2-4.0 on it, so the mistake here is 1000x (3.0 for 3.0e-3: the "e-3" left out). Measured on
# it (CPython 3.11, 2 ranks): the loss stops falling and climbs from step 18 (LR ~0.45, a slow
# divergence the watcher calls at +11%), the re-run after the rollback from step 43 (to 10 at
# step 63), the LR cut decided at step 75, and at a tenth of the LR the run trains to the end.
SMALL_MODEL = ["model.hidden_size=64", "model.ffn_hidden_size=172", "model.seq_length=64",
               "model.max_position_embeddings=64"]
# The LR cut is a tenth, not OPT's 0.67: a 1000x mistake needs an order of magnitude, and where a
# mistake still diverges depends on the machine's float kernels (conf/chaos/lr_blowup.yaml).
LR_CUT = 0.1
LR_BLOWUP = ["chaos=lr_blowup", "watcher=demo", "policy=demo", "cluster.local_nodes=1", "health.skip=true",
             *SMALL_MODEL,
             "policy.instability.ladder=[{action: rollback_skip, max_uses: 10, skip_data: true, lr_factor: 1.0}, "
             f"{{action: lower_lr, max_uses: 6, skip_data: true, lr_factor: {LR_CUT}}}, "
             "{action: reset_optimizer, max_uses: 2, skip_data: true, lr_factor: 1.0, rewarmup_iters: 200}]"]
# The mistake, and a pause on the last step but one (index 1).
FAULTS = f"chaos.faults=[{{kind: lr_blowup, at_step: 120, factor: 1000}}, {{kind: pause_at_step, at_step: {PAUSE}}}]"
HELD = ["policy.act_on=[restart, lower_lr]", "notify.webhook=env:RUNMGR_TEST_HOOK", "notify.backoff_s=0.05",
        f"training.train_iters={TRAIN_ITERS}"]


@pytest.fixture(scope="module")
def held_run(tmp_path_factory) -> dict:
    """The lineage, driven as a person would: wait for the held rollback, read `runmgr status`,
    the webhook's message, `runmgr approve`; then the run to its end, and its logbook."""
    receiver = Receiver()
    try:
        run = LaunchedRun(tmp_path_factory.mktemp("lr-blowup") / "lr_blowup", base=[*LR_BLOWUP, FAULTS, *HELD],
                          env={**os.environ, "RUNMGR_TEST_HOOK": receiver.url}).start()
        # The bounds are for a run that never gets there (the divergence is some 20-40 steps in).
        status = run.wait_for(lambda s: s["state"] == "awaiting_approval", timeout=900, what="the held rollback")
        shown = cli.runmgr("status", str(run.run_dir), cwd=ROOT)
        told = receiver.wait_for(1)
        approved = cli.runmgr("approve", str(run.run_dir), cwd=ROOT)
        # Once the driver took the answer (the rolled-back sub-run is on), the pause may let go.
        if approved.returncode == 0:
            run.wait_for(lambda s: s["subrun"] != status["subrun"], what="the approved rollback's sub-run")
        run.release(PAUSE, index=1)
        code = run.wait(timeout=900)
        late = cli.runmgr("decline", str(run.run_dir), cwd=ROOT)
    finally:
        receiver.close()
    return {"code": code, "run": run, "events": runmgr_json_lines("logbook", "events", str(run.run_dir), "--json"),
            "output": run.output(), "status": status, "shown": shown, "told": told, "approved": approved,
            "late": late, "url": receiver.url}


def injections(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == "event" and e["kind"] == "chaos" and e["data"]["kind"] == kind]


def test_a_held_rollback_is_told_approved_from_the_cli_and_carried_out(held_run):
    status, events = held_run["status"], held_run["events"]
    assert status["awaiting"]["action"] == "rollback_skip" and "loss_spike" in status["awaiting"]["incident"]
    shown = held_run["shown"]
    assert "waiting for a person: runmgr would rollback_skip" in shown.stdout, shown.stdout + shown.stderr
    (told,) = held_run["told"]
    assert told["kind"] == "recommendation" and "waiting for a person" in told["text"]
    approved = held_run["approved"]
    assert approved.returncode == 0 and "approved rollback_skip" in approved.stdout, approved.stderr
    assert held_run["code"] == 0, held_run["output"][-3000:]

    (held,) = [e for e in events if e["type"] == "decision" and e["action"] == "rollback_skip"]
    assert held["plan"]["awaits_approval"] and "held for a person" in held["reason"]
    (approval,) = [e for e in events if e["type"] == "event" and e["kind"] == "approved"]
    assert approval["data"]["by"] == getpass.getuser() and approval["seq"] > held["seq"]
    rolled_back = next(e for e in events if e["type"] == "subrun_start" and e["seq"] > approval["seq"])
    # Back to a checkpoint before the spike's onset, its window skipped.
    assert rolled_back["start_step"] < incident_of(events, held)["step"] and rolled_back["plan"]["skip_ranges"]
    ends = [e for e in events if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == TRAIN_ITERS
    assert held_run["url"] not in str(events) + held_run["output"]
    # Nothing is held any more: an answer now is one line, exit 2.
    late = held_run["late"]
    assert late.returncode == 2 and "holds no remedy for a person" in late.stderr and late.stderr.count("\n") == 1


def out_of_band(figures: dict, spike) -> bool:
    """The incident's figures left the run's own band by the thresholds the run watched with."""
    if figures.get("drift"):
        return figures["rolling_median"] > figures["lowest_median"] * (1 + spike.drift_rise)
    excess = figures["peak_value"] - figures["baseline_median"]
    return excess > spike.z_threshold * figures["robust_sigma"] and excess > spike.min_rise * figures["baseline_median"]


def test_an_lr_blowup_really_diverges_and_a_lower_lr_gets_the_run_past_it(held_run, tmp_path):
    events = held_run["events"]
    assert held_run["code"] == 0, held_run["output"][-3000:]
    # The remedies of loss spikes (a loaded machine may add incidents of its own, a slowdown say).
    acted = [d for d in events if d["type"] == "decision" and d["action"] != "ignore"
             and incident_of(events, d)["kind"] == "loss_spike"]
    divergence = incident_of(events, acted[0])
    assert not divergence["evidence"]["recovered"]
    # Judged against the run's own baseline at the moment of detection, with the run's own
    # thresholds. (How far the loss climbs within the grace window is no fixed multiple: it
    # is the same on every try on one machine, but the corpus is the Python build's stdlib.)
    spike = load_run_config("demo", [*LR_BLOWUP, FAULTS, *HELD, f"run.dir={tmp_path}"]).watcher.loss_spike
    assert out_of_band(divergence["evidence"]["evidence"], spike), divergence["summary"]
    (mistake,) = injections(events, "lr_blowup")
    assert mistake["seq"] < divergence["seq"] and mistake["data"]["step"] < divergence["step"]
    # Rolling back alone does not cure a bad LR; the ladder then lowers it for good (OPT 12.42-12.53).
    assert [d["action"] for d in acted][:2] == ["rollback_skip", "lower_lr"]
    cut = next_subrun_start(events, acted[1])
    settings = next(e for e in events if e["type"] == "event" and e["kind"] == "effective_settings"
                    and e["subrun"] == cut["subrun"])
    assert settings["data"]["lr_scale"] == pytest.approx(LR_CUT)
    ends = [e for e in events if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == TRAIN_ITERS
    assert ends[-1]["last_step"] > divergence["step"]
