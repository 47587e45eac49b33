"""A Megatron job under runmgr, end to end: ``trainer.kind=megatron`` with the built-in trainer as
the script, spoken to in Megatron's dialect under a real torchrun per node. runmgr's garbage copy of
the data reaches the job as its ``--data-path`` (the job's real loss spikes on it), the rollback
reaches it as ``--load``/``--ckpt-step`` and Megatron's ``--iterations-to-skip``, and the kept
iterations never train on the garbage: one short launch, the mechanism that only a real job shows.

The rest is checked where it costs less: each remedy's decision and flags on a user's script through
OPT Run 12 (tests/e2e/test_megatron_standin_chaos.py), the built-in trainer honouring the flags
(tests/trainer/test_megatron_dialect.py), a MindSpeed-LLM rollback without a skip and its reason, and
the plan as the node's argv (tests/runmgr/megatron/test_remedies_reach_the_job.py, test_flags.py)."""

from __future__ import annotations

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, runmgr_json_lines
from tests.e2e.test_closed_loop import decisions_after, incident_of, injections, next_subrun_start

pytestmark = pytest.mark.slow

GLOBAL_BATCH = 16  # the demo's training.global_batch_size, spelled --global-batch-size in the commands
TRAIN_ITERS = 60
# Garbage from iteration 25 for 12 (more than the demo watcher's 10-step grace: a persistent spike).
# The demo policy rolls back to a checkpoint at least 10 steps before the onset (10, saved every 10)
# and skips from 5 iterations before the onset to 25 after it (20-50); the run trains 51-60 after it.
GARBAGE = "chaos.faults=[{kind: garbage_data, at_step: 25, steps: 12}]"


@pytest.fixture(scope="module")
def garbage_run(tmp_path_factory, shared_ray) -> dict:
    """The built-in trainer as a Megatron-LM job on the session's Ray (the remedy restarts the ranks,
    never the cluster): one node of one rank, one torchrun (nothing here depends on the ranks'
    number: each rank is a new Python importing torch and the trainer, about 3.3 CPU-seconds a
    sub-run; two ranks of the built-in trainer under torchrun are tests/trainer/test_megatron_dialect.py's
    and the README's, a job across nodes, one torchrun each, tests/e2e/test_megatron_standin_chaos.py's)."""
    base = ["chaos=garbage_data", GARBAGE, "watcher=demo", "policy=demo", "health.skip=true",
            "cluster.num_workers=1", "megatron.nproc_per_node=1", f"cluster.address={shared_ray.address}",
            "trainer.kind=megatron",
            f"training.train_iters={TRAIN_ITERS}", "checkpoint.save_interval=10"]
    run = LaunchedRun(tmp_path_factory.mktemp("megatron") / "garbage", base=base).start()
    code = run.wait(timeout=600)
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


def garbage_window(events: list[dict]) -> tuple[dict, int, int]:
    """The injection and the stream positions [start, end) it made garbage."""
    (injected,) = injections(events, "garbage_data")
    start, end = (int(x) for x in injected["data"]["target"].split("[")[1].rstrip(")").split(", "))
    return injected, start, end


def test_the_garbage_reaches_the_job_as_its_data_and_the_rollback_gets_it_to_the_end(garbage_run):
    assert garbage_run["code"] == 0, garbage_run["output"][-3000:]
    events = garbage_run["events"]
    ends = [e for e in events if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == TRAIN_ITERS
    # runmgr's garbage copy is what the job reads: its own --data-path, derived from the conf.
    (data_path,) = {tuple(flag(argv, "--data-path") or ()) for argv in commands_of(events, "1.00")}
    assert data_path and "chaos" in data_path[0], data_path
    injected, start, end = garbage_window(events)
    decision = next(d for d in decisions_after(events, injected["time"]) if d["action"] == "rollback_skip")
    spike = incident_of(events, decision)
    assert spike["kind"] == "loss_spike" and start <= spike["evidence"]["onset_sample"] < end, spike
    # The rollback reaches the job as Megatron's flags: the checkpoint it decided on, as --load and --ckpt-step.
    resumed = next_subrun_start(events, decision)
    assert resumed["start_step"] == decision["plan"]["restart_from_step"]
    for argv in commands_of(events, resumed["subrun"]):
        assert flag(argv, "--ckpt-step") == [str(resumed["start_step"])] and flag(argv, "--load") is not None


def test_rollback_skips_the_window_as_iterations_and_the_kept_steps_never_train_on_it(garbage_run):
    events = garbage_run["events"]
    injected, start, end = garbage_window(events)
    decision = next(d for d in decisions_after(events, injected["time"]) if d["action"] == "rollback_skip")
    resumed = next_subrun_start(events, decision)
    skipped = {int(i) for argv in commands_of(events, resumed["subrun"])
               for i in flag(argv, "--iterations-to-skip") or ()}
    # Megatron's iteration J (1-indexed) trains on stream positions [(J-1) x B, J x B).
    window = set(range(start // GLOBAL_BATCH + 1, -(-end // GLOBAL_BATCH) + 1))
    assert window <= skipped, (sorted(window), sorted(skipped))
    rows = runmgr_json_lines("logbook", "metrics", str(garbage_run["run"].run_dir), "--json")
    kept = {row["step"]: row for row in rows if row["subrun"] >= resumed["subrun"]}
    assert kept and max(kept) == TRAIN_ITERS  # it trained on past the window
    for step, row in kept.items():
        trained = (row["consumed_samples"] - GLOBAL_BATCH, row["consumed_samples"])
        assert trained[1] <= start or trained[0] >= end, (step, trained)
    # A skipped iteration is still an iteration (Megatron's --iterations-to-skip): the kept steps are
    # every iteration but the skipped ones of the last plan.
    skips = next(e for e in reversed(events) if e["type"] == "subrun_start")["plan"]["skip_ranges"]
    dropped = {j for a, b in skips for j in range(a // GLOBAL_BATCH + 1, -(-b // GLOBAL_BATCH) + 1)}
    assert sorted(kept_losses(garbage_run["run"].run_dir)) == [j for j in range(1, TRAIN_ITERS + 1)
                                                               if j not in dropped]
