"""OPT Run 12's schedule for a Megatron job (``chaos=opt_run12_megatron``) on a user's own script:
the stand-in ``pretrain_gpt.py`` (tests/e2e/standin/) under a real torchrun per node, on a local Ray
of three nodes. runmgr carries out the schedule's process faults itself (a killed rank, a hung
rank, a straggler, a failed checkpoint write, a node's ECC error); the data faults cannot reach a
user's script (runmgr does not rewrite its data), so the stand-in's own data holds the same garbage
windows (``STANDIN_BAD_SAMPLES``, computed here from the schedule, its recurring instability brought
earlier to end the run sooner). The run gets through by itself, and every remedy reaches the job as
Megatron's flags, read back from the logbook."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runmgr.chaos.build import fault_windows
from runmgr.config.chaos import DATA_KINDS, FaultSpec
from tests.e2e.harness import ROOT, LaunchedRun, runmgr_json_lines, runmgr_traceback
from tests.e2e.test_closed_loop import decisions_after, incident_of, next_subrun_start
from tests.e2e.test_megatron_job import commands_of, flag

pytestmark = pytest.mark.slow

STANDIN = Path(__file__).parent / "standin" / "pretrain_gpt.py"
SCHEDULE = ROOT / "conf" / "chaos" / "opt_run12_megatron.yaml"
BATCH, ITERS, LR, MIN_LR, SAVE_INTERVAL = 16, 200, 3.0e-3, 3.0e-4, 20
# The recurring instability 25 iterations earlier than the schedule's 160: the ECC exclusion is over by
# then here too (the sub-run after it starts from checkpoint 100, or 120 on a loaded machine). Its spikes at 135 and 163
# are rolled back to 120 (skipping 130-159) and to 140 (skipping 158-187): the run ends 13 iterations
# after that, 40 fewer than the schedule's 240, with every fault and remedy of it.
RECURRING_AT = 135


def split_schedule() -> tuple[list[dict], str]:
    """The schedule's process faults (for runmgr to inject) and its data faults' garbage windows
    as the stand-in's ``STANDIN_BAD_SAMPLES`` (the recurring instability's at RECURRING_AT)."""
    faults = [{**f, "at_step": RECURRING_AT} if f["kind"] == "recurring_instability" else f
              for f in yaml.safe_load(SCHEDULE.read_text())["faults"]]
    process = [f for f in faults if f["kind"] not in DATA_KINDS]
    windows = [w.window for i, f in enumerate(faults) if f["kind"] in DATA_KINDS
               for w in fault_windows(f"{i}:{f['kind']}", FaultSpec(**f), BATCH)]
    return process, ",".join(f"{w.start}-{w.end}" for w in windows)


def slowed_iterations(process: list[dict]) -> str:
    """The iterations the slowed rank can run slowed, as the stand-in's ``STANDIN_BUSY_ITERS``: from
    the slow_rank's step to the save the failed checkpoint write breaks, which ends that sub-run
    (the slowing ends with its processes). Only there must the straggler report tell a rank whose
    CPU is cut from its peers; elsewhere the ranks sleep their iteration time (about 30 CPU-seconds
    of two ranks' busy compute through the whole lineage, spent for nothing)."""
    (slow,) = [f for f in process if f["kind"] == "slow_rank"]
    (broken,) = [f for f in process if f["kind"] == "checkpoint_fail"]
    return f"{slow['at_step']}-{-(-broken['at_step'] // SAVE_INTERVAL) * SAVE_INTERVAL}"


def hydra_list(faults: list[dict]) -> str:
    return "[" + ", ".join("{" + ", ".join(f"{k}: {v}" for k, v in f.items()) + "}" for f in faults) + "]"


@pytest.fixture(scope="module")
def standin_run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("standin-chaos")
    process, bad = split_schedule()
    args = ["--save", str(root / "ckpt"), "--train-iters", str(ITERS), "--global-batch-size", str(BATCH),
            "--micro-batch-size", "4", "--lr", str(LR), "--min-lr", str(MIN_LR), "--lr-warmup-iters", "20",
            "--save-interval", str(SAVE_INTERVAL), "--log-interval", "1", "--log-straggler"]
    base = ["chaos=opt_run12_megatron", f"chaos.faults={hydra_list(process)}", "watcher=demo", "policy=demo",
            "cluster.local_nodes=3", "cluster.num_workers=2", "health.skip=true", "trainer.kind=megatron",
            f"megatron.script={STANDIN}", "megatron.args=[" + ",".join(args) + "]",
            "megatron.env.STANDIN_ITER_S=0.05", f"megatron.env.STANDIN_BAD_SAMPLES={bad}",
            f"megatron.env.STANDIN_BUSY_ITERS={slowed_iterations(process)}"]
    run = LaunchedRun(root / "opt_run12", base=base).start()
    code = run.wait(timeout=900)
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    return {"code": code, "run": run, "events": events, "output": run.output()}


def injected(events: list[dict], kind: str) -> dict:
    (found,) = [e for e in events if e["type"] == "event" and e["kind"] == "chaos" and e["data"]["kind"] == kind]
    return found


def first_decision(events: list[dict], after: float, kind: str, category: str | None = None) -> dict:
    return next(d for d in decisions_after(events, after) if incident_of(events, d)["kind"] == kind
                and (category is None or incident_of(events, d)["evidence"]["evidence"].get("category") == category))


def test_the_user_s_job_gets_through_run12_by_itself(standin_run):
    assert standin_run["code"] == 0, standin_run["output"][-3000:]
    assert not runmgr_traceback(standin_run["output"])
    ends = [e for e in standin_run["events"] if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == ITERS
    kinds = {e["data"]["kind"] for e in standin_run["events"] if e["type"] == "event" and e["kind"] == "chaos"}
    assert kinds == {"kill_worker", "hang_rank", "slow_rank", "checkpoint_fail", "device_ecc"}


@pytest.mark.parametrize("fault, incident_kind, category, action", [
    ("kill_worker", "worker_death", "killed", "restart"),
    ("hang_rank", "hang", None, "dump_and_restart"),
    ("checkpoint_fail", "worker_death", "io", "restart"),
    ("device_ecc", "device_fault", None, "exclude_node"),
])
def test_each_process_fault_restarts_the_job_from_a_checkpoint_on_megatron_s_flags(
        standin_run, fault, incident_kind, category, action):
    events = standin_run["events"]
    decision = first_decision(events, injected(events, fault)["time"], incident_kind, category)
    assert decision["action"] == action, decision["reason"]
    start = next_subrun_start(events, decision)
    for argv in commands_of(events, start["subrun"]):
        assert flag(argv, "--ckpt-step") == [str(start["start_step"])] and flag(argv, "--load") is not None


def test_the_straggler_is_named_from_the_job_s_own_straggler_report(standin_run):
    events = standin_run["events"]
    slow = injected(events, "slow_rank")
    slowed = int(slow["data"]["target"].split()[1])
    straggler = next(e for e in events if e["type"] == "incident" and e["kind"] == "straggler")
    assert straggler["ranks"] == [slowed] and straggler["time"] >= slow["time"]


def test_the_instability_ladder_reaches_the_job_as_skips_an_lr_cut_and_an_optimizer_reset(standin_run):
    events = standin_run["events"]
    actions = [d["action"] for d in events if d["type"] == "decision"
               and incident_of(events, d)["kind"] == "loss_spike"]
    assert actions[:3] == ["rollback_skip", "lower_lr", "reset_optimizer"], actions
    rollback = next(d for d in events if d["type"] == "decision" and d["action"] == "rollback_skip")
    resumed = next_subrun_start(events, rollback)
    for argv in commands_of(events, resumed["subrun"]):  # back to the checkpoint it decided on, skipping
        assert flag(argv, "--ckpt-step") == [str(resumed["start_step"])] and flag(argv, "--load") is not None
        assert flag(argv, "--iterations-to-skip")
    lower = next(d for d in events if d["type"] == "decision" and d["action"] == "lower_lr")
    for argv in commands_of(events, next_subrun_start(events, lower)["subrun"]):
        assert float(flag(argv, "--lr")[0]) == pytest.approx(LR * 0.67)
        assert float(flag(argv, "--min-lr")[0]) == pytest.approx(MIN_LR * 0.67)
        assert "--override-opt_param-scheduler" in argv
    reset = next(d for d in events if d["type"] == "decision" and d["action"] == "reset_optimizer")
    assert "restarts its LR schedule" in reset["reason"]  # the fresh warmup, recorded as such
    assert all("--no-load-optim" in argv for argv in commands_of(events, next_subrun_start(events, reset)["subrun"]))


def test_no_planned_silence_was_taken_for_a_hang(standin_run):
    events = standin_run["events"]
    hung = injected(events, "hang_rank")
    hangs = [e for e in events if e["type"] == "incident" and e["kind"] == "hang"]
    # The one hang is the injected one: the rollbacks' skipped iterations and the saves are expected.
    assert len(hangs) == 1 and hangs[0]["time"] >= hung["time"]
