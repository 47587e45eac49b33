"""A Megatron job under runmgr, end to end: ``trainer.kind=megatron`` with the
built-in trainer as the script, spoken to in Megatron's dialect under a real
torchrun per node. The demo's OPT Run 12 schedule meets the same classes of
incident -> decision -> sub-run as on the built-in path, each remedy reaches
the job as the flavor's flags (read back from the logbook's command lines),
and a divergence is rolled back with ``--iterations-to-skip`` (megatron_lm) or
without a skip, saying why (mindspeed_llm)."""

from __future__ import annotations

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, runmgr_json_lines
from tests.e2e.test_closed_loop import DEMO, RUN12_REMEDIES, decisions_after, injections, next_subrun_start, remedy_gets_past

pytestmark = pytest.mark.slow

MEGATRON = ["trainer.kind=megatron"]
# The demo's schedule re-timed for Megatron's skip (a skipped iteration still counts), with
# room after the third rollback (conf/chaos/opt_run12_megatron.yaml says why).
MEGATRON_DEMO = ["chaos=opt_run12_megatron", *DEMO[1:], *MEGATRON, "training.train_iters=240"]
GLOBAL_BATCH = 16  # the demo's training.global_batch_size, spelled --global-batch-size in the commands


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory) -> dict:
    run = LaunchedRun(tmp_path_factory.mktemp("megatron") / "opt_run12", base=MEGATRON_DEMO).start()
    code = run.wait(timeout=900)
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    return {"code": code, "run": run, "events": events, "output": run.output()}


def commands_of(events: list[dict], subrun: str) -> list[list[str]]:
    """The argv of each node of ``subrun``, as the logbook recorded it."""
    return [e["data"]["argv"] for e in events
            if e["type"] == "event" and e["kind"] == "command" and e["subrun"] == subrun]


def flag(argv: list[str], name: str) -> list[str] | None:
    """The values after ``name`` (up to the next flag); None when it is absent."""
    if name not in argv:
        return None
    values = []
    for item in argv[argv.index(name) + 1:]:
        if item.startswith("--"):
            break
        values.append(item)
    return values


def test_the_megatron_job_survives_run12_by_itself(megatron_run):
    assert megatron_run["code"] == 0, megatron_run["output"][-3000:]
    ends = [e for e in megatron_run["events"] if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == 240
    kinds = {e["data"]["kind"] for e in megatron_run["events"] if e["type"] == "event" and e["kind"] == "chaos"}
    assert {"kill_worker", "hang_rank", "garbage_data", "slow_rank", "device_ecc", "checkpoint_fail",
            "recurring_instability"} <= kinds
    # A skipped iteration is still an iteration (Megatron's --iterations-to-skip): the kept steps are
    # every iteration but the skipped ones of the last plan.
    skips = next(e for e in reversed(megatron_run["events"]) if e["type"] == "subrun_start")["plan"]["skip_ranges"]
    skipped = {j for a, b in skips for j in range(a // GLOBAL_BATCH + 1, -(-b // GLOBAL_BATCH) + 1)}
    assert sorted(kept_losses(megatron_run["run"].run_dir)) == [j for j in range(1, 241) if j not in skipped]


@pytest.mark.parametrize("fault, incident_kind, cause, action", RUN12_REMEDIES)
def test_each_fault_meets_the_same_remedy_as_on_the_built_in_path(megatron_run, fault, incident_kind, cause, action):
    events = megatron_run["events"]
    start = remedy_gets_past(events, fault, incident_kind, cause, action)
    # The next sub-run starts from the checkpoint the decision led to, on Megatron's flags.
    for argv in commands_of(events, start["subrun"]):
        assert flag(argv, "--ckpt-step") == [str(start["start_step"])]
        assert flag(argv, "--load") is not None


def test_a_straggler_is_seen_from_megatrons_straggler_report(megatron_run):
    events = megatron_run["events"]
    (injected,) = injections(events, "slow_rank")
    slowed = int(injected["data"]["target"].split()[1])
    straggler = next(e for e in events if e["type"] == "incident" and e["kind"] == "straggler"
                     and e["time"] >= injected["time"])
    assert straggler["ranks"] == [slowed]


def test_rollback_skips_the_window_as_iterations_and_the_kept_steps_never_train_on_it(megatron_run):
    events = megatron_run["events"]
    (injected,) = injections(events, "garbage_data")
    start, end = (int(x) for x in injected["data"]["target"].split("[")[1].rstrip(")").split(", "))
    decision = next(d for d in decisions_after(events, injected["time"]) if d["action"] == "rollback_skip")
    resumed = next_subrun_start(events, decision)
    skipped = {int(i) for argv in commands_of(events, resumed["subrun"])
               for i in flag(argv, "--iterations-to-skip") or ()}
    # Megatron's iteration J (1-indexed) trains on stream positions [(J-1) x B, J x B).
    window = set(range(start // GLOBAL_BATCH + 1, -(-end // GLOBAL_BATCH) + 1))
    assert window <= skipped, (sorted(window), sorted(skipped))
    rows = runmgr_json_lines("logbook", "metrics", str(megatron_run["run"].run_dir), "--json")
    kept = {row["step"]: row for row in rows if row["subrun"] >= resumed["subrun"]}
    for step, row in kept.items():
        trained = (row["consumed_samples"] - GLOBAL_BATCH, row["consumed_samples"])
        assert trained[1] <= start or trained[0] >= end, (step, trained)


def test_lower_lr_and_reset_adam_reach_the_job_as_megatrons_flags(megatron_run):
    events = megatron_run["events"]
    lower = next(d for d in events if d["type"] == "decision" and d["action"] == "lower_lr")
    for argv in commands_of(events, next_subrun_start(events, lower)["subrun"]):
        assert float(flag(argv, "--lr")[0]) == pytest.approx(3.0e-3 * 0.67)
        assert float(flag(argv, "--min-lr")[0]) == pytest.approx(3.0e-4 * 0.67)
        assert "--override-opt_param-scheduler" in argv  # Megatron asserts on a changed LR without it
    reset = next(d for d in events if d["type"] == "decision" and d["action"] == "reset_optimizer")
    assert "restarts its LR schedule" in reset["reason"]  # the fresh warmup, recorded as such
    for argv in commands_of(events, next_subrun_start(events, reset)["subrun"]):
        assert "--no-load-optim" in argv


@pytest.fixture(scope="module")
def mindspeed_run(tmp_path_factory) -> dict:
    # One rung: the garbage comes back after a rollback that cannot skip it, and the second spike
    # stops the run for a person instead of climbing the whole ladder (this test needs the first).
    one_rung = ("policy.instability.ladder=[{action: rollback_skip, max_uses: 1, skip_data: true, lr_factor: 1.0, "
                "clip_grad: null, rewarmup_iters: 0}]")
    base = ["chaos=garbage_data", "watcher=demo", "policy=demo", one_rung, "cluster.local_nodes=1",
            "health.skip=true", *MEGATRON, "megatron.flavor=mindspeed_llm", "training.train_iters=80"]
    run = LaunchedRun(tmp_path_factory.mktemp("mindspeed") / "garbage", base=base).start()
    code = run.wait(timeout=900)
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    return {"code": code, "run": run, "events": events, "output": run.output()}


def test_mindspeed_rolls_back_without_a_skip_and_says_why(mindspeed_run):
    events = mindspeed_run["events"]
    (injected,) = injections(events, "garbage_data")
    decision = next(d for d in decisions_after(events, injected["time"]) if d["action"] == "rollback_skip")
    assert decision["plan"]["skip_ranges"] == []
    assert "MindSpeed-LLM" in decision["reason"] and "never reads it" in decision["reason"], decision["reason"]
    resumed = next_subrun_start(events, decision)
    for argv in commands_of(events, resumed["subrun"]):
        assert "--iterations-to-skip" not in argv and flag(argv, "--ckpt-step") == [str(resumed["start_step"])]
