"""A user's own Megatron job left unattended (issue 26, red-team issue 33): real ``runmgr launch``
runs of a stand-in ``pretrain_gpt.py`` (tests/e2e/standin/) under a real torchrun per node through
Ray, each case as a user met it:

- a flag the script refuses ends the run after one try as needing a person, in the job's words;
- the iterations a rollback asked Megatron to skip are silent, and that silence is not a hang;
- a job that finishes is finished, even when one node ends well before the other;
- a job that exits 0 before ``--train-iters`` is an incident: restarted from what it saved, and a
  person is needed when it saved nothing new (or never printed an iteration line at all);
- a job that prints nothing at all needs a person after one try, its stacks dumped.

Two nodes of one rank each on the session's shared Ray; each case is one short launch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.e2e.harness import LaunchedRun, runmgr_json_lines, runmgr_text, runmgr_traceback

pytestmark = pytest.mark.slow

STANDIN = Path(__file__).parent / "standin" / "pretrain_gpt.py"
BATCH = 8


def job_args(save: Path, train_iters: int, *extra: str) -> str:
    args = ["--save", str(save), "--train-iters", str(train_iters), "--global-batch-size", str(BATCH),
            "--micro-batch-size", "4", "--lr", "1e-3", "--min-lr", "1e-4", "--save-interval", "10",
            "--log-interval", "1", *extra]
    return "megatron.args=[" + ",".join(args) + "]"


def launch(tmp_path: Path, shared_ray, name: str, train_iters: int, *overrides: str, extra_args=()) -> dict:
    """One launch of the stand-in; its exit code, console output and logbook events."""
    run_dir = tmp_path / name
    base = ["chaos=none", "watcher=demo", "policy=demo", "health.skip=true", "cluster.num_workers=2",
            "trainer.kind=megatron", f"megatron.script={STANDIN}",
            job_args(run_dir.parent / f"{name}-ckpt", train_iters, *extra_args)]
    run = LaunchedRun(run_dir, base=base, extra=[f"cluster.address={shared_ray.address}", *overrides]).start()
    code = run.wait(timeout=600)
    events = runmgr_json_lines("logbook", "events", str(run_dir), "--json")
    return {"code": code, "output": run.output(), "events": events, "run": run}


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def incidents(events: list[dict]) -> list[dict]:
    return of_type(events, "incident")


def evidence(incident: dict) -> dict:
    return incident["evidence"]["evidence"]


def no_traceback(output: str) -> bool:
    return not runmgr_traceback(output)


def test_a_flag_the_script_refuses_needs_a_person_after_one_try_in_the_job_s_words(tmp_path, shared_ray):
    run = launch(tmp_path, shared_ray, "usage", 40, extra_args=["--bogus-flag"])
    said = "pretrain_gpt.py: error: unrecognized arguments: --bogus-flag"
    assert run["code"] == 1 and no_traceback(run["output"]), run["output"][-3000:]
    assert said in run["output"]  # on the console, under the incident
    starts = of_type(run["events"], "subrun_start")
    assert [s["subrun"] for s in starts] == ["1.00"]  # one try: no restart of a deterministic failure
    (death,) = incidents(run["events"])
    assert death["kind"] == "worker_death" and said in death["summary"]
    assert evidence(death)["category"] == "config" and evidence(death)["exit_code"] == 2
    assert said in evidence(death)["last_output"]
    (end,) = of_type(run["events"], "subrun_end")
    assert end["end_state"] == "failed" and said in end["reason"]
    assert any(e["kind"] == "needs_human" for e in of_type(run["events"], "event"))
    shown = runmgr_text("logbook", "show", str(run["run"].run_dir), "--full")
    assert said in shown and "last output of the job" in shown


def test_thirty_skipped_iterations_after_a_rollback_are_not_a_hang(tmp_path, shared_ray):
    # The data of iterations 45-59 is bad: the loss spikes there, the demo policy rolls back to
    # checkpoint 30 and skips 5 iterations' samples before the onset to 25 after: iterations 40-69,
    # each a silent dummy step of 0.3 s (9 s in all) where the demo's hang window is 5 s.
    bad = f"{44 * BATCH}-{59 * BATCH}"
    run = launch(tmp_path, shared_ray, "skips", 80, "megatron.env.STANDIN_ITER_S=0.1",
                 "megatron.env.STANDIN_SKIP_ITER_S=0.3", f"megatron.env.STANDIN_BAD_SAMPLES={bad}")
    assert run["code"] == 0 and no_traceback(run["output"]), run["output"][-3000:]
    kinds = [(i["kind"], i["subrun"]) for i in incidents(run["events"])]
    assert ("loss_spike", "1.00") in kinds and not any(kind == "hang" for kind, _ in kinds), kinds
    resumed = [s for s in of_type(run["events"], "subrun_start") if s["subrun"] == "1.01"]
    assert resumed and resumed[0]["start_step"] == 30
    argv = next(e["data"]["argv"] for e in of_type(run["events"], "event")
                if e["kind"] == "command" and e["subrun"] == "1.01")
    skipped = argv[argv.index("--iterations-to-skip") + 1:]
    assert skipped[:30] == [str(i) for i in range(40, 70)]
    ends = of_type(run["events"], "subrun_end")
    assert ends[-1]["subrun"] == "1.01" and ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == 80


def test_a_job_that_finishes_is_finished_though_one_node_ends_long_before_the_other(tmp_path, shared_ray):
    # Rank 1 (node 1) exits right after the last iteration; rank 0 stays 8 s more (its teardown),
    # longer than the demo's hang window, printing one line at its end. (The environment is given
    # as one mapping, megatron.env={K: V, ...}, as a user would write it.)
    run = launch(tmp_path, shared_ray, "finish", 20,
                 "megatron.env={STANDIN_SLOW_FINISH_RANK: 0, STANDIN_SLOW_FINISH_S: 8}")
    assert run["code"] == 0 and no_traceback(run["output"]), run["output"][-3000:]
    assert incidents(run["events"]) == []
    envs = [e["data"]["env"] for e in of_type(run["events"], "event") if e["kind"] == "command"]
    assert envs and all(env["STANDIN_SLOW_FINISH_S"] == "8" for env in envs)  # the mapping reached every node
    (end,) = of_type(run["events"], "subrun_end")
    assert (end["subrun"], end["end_state"], end["last_step"]) == ("1.00", "finished", 20)


def test_exit_0_before_train_iters_is_an_incident_restarted_once_from_what_it_saved(tmp_path, shared_ray):
    # The exits are the run's own moments: a step-phase hang window of a minute keeps a loaded machine's
    # late report of an exit from being taken for a hang (seen: 5 s at a load of 17 on 2 cores).
    run = launch(tmp_path, shared_ray, "early", 20, "megatron.env.STANDIN_EXIT_AFTER=15",
                 "watcher.hang.step={initial_s: 60.0, min_s: 60.0, max_s: 60.0}")
    assert run["code"] == 1 and no_traceback(run["output"]), run["output"][-3000:]
    first, second = incidents(run["events"])
    assert (first["kind"], first["step"], second["kind"], second["step"]) == ("early_exit", 15, "early_exit", 15)
    decisions = [d["action"] for d in of_type(run["events"], "decision")]
    assert decisions == ["restart", "abort"]  # it saved step 10 first; the second time nothing newer
    assert evidence(first)["saved_since_start"] and not evidence(second)["saved_since_start"]
    ends = of_type(run["events"], "subrun_end")
    assert [e["end_state"] for e in ends] == ["restarting", "failed"]
    assert not any(e["end_state"] == "finished" for e in ends)


def test_a_job_that_prints_garbage_and_exits_0_is_not_finished_at_step_0(tmp_path, shared_ray):
    run = launch(tmp_path, shared_ray, "garbage", 40, "megatron.env.STANDIN_BEHAVIOUR=garbage")
    assert run["code"] == 1 and no_traceback(run["output"]), run["output"][-3000:]
    (incident,) = incidents(run["events"])
    assert incident["kind"] == "early_exit" and incident["step"] == 0
    assert "without printing a single iteration line" in incident["summary"]
    assert any("not a line Megatron prints" in line for line in evidence(incident)["last_output"])
    assert "\\x00" in run["output"] and "\x00" not in run["output"]  # its bytes reach the console as text
    (end,) = of_type(run["events"], "subrun_end")
    assert end["end_state"] == "failed"


def test_a_silent_job_needs_a_person_after_one_try_with_its_stacks(tmp_path, shared_ray):
    run = launch(tmp_path, shared_ray, "silent", 40, "megatron.env.STANDIN_BEHAVIOUR=silent",
                 "watcher.hang.init={initial_s: 4.0, min_s: 1.0, max_s: 60.0}")
    assert run["code"] == 1 and no_traceback(run["output"]), run["output"][-3000:]
    (hang,) = incidents(run["events"])
    assert hang["kind"] == "hang" and evidence(hang)["never_stepped"] is True
    (decision,) = of_type(run["events"], "decision")
    assert decision["action"] == "abort" and "not printed a single iteration line" in decision["reason"]
    assert "it printed nothing" in decision["reason"]
    assert [s["subrun"] for s in of_type(run["events"], "subrun_start")] == ["1.00"]
    dumped = [e for e in of_type(run["events"], "event") if e["kind"] == "stacks_dumped"]
    assert dumped and sorted(dumped[0]["data"]["files"]) == ["rank0.txt", "rank1.txt"]


def test_a_forced_lr_cut_on_a_job_without_lr_is_passed_over_with_its_reason(tmp_path, shared_ray):
    # The job gives no --lr: lint refuses the demo ladder's LR cut at launch (tests/runmgr/lint);
    # forced, the second instability in a row passes the lower_lr rung over to the optimizer reset.
    # Iterations 25-39 are bad: rolled back to 10, iterations 20-49 skipped; then 60-74: rolled back
    # to 50 (saved after the first skip), iterations 55-84 skipped; the run ends 6 iterations after.
    bad = f"{24 * BATCH}-{39 * BATCH},{59 * BATCH}-{74 * BATCH}"
    no_lr = ["--save", str(tmp_path / "nolr-ckpt"), "--train-iters", "90", "--global-batch-size", str(BATCH),
             "--save-interval", "10", "--log-interval", "1"]
    run = launch(tmp_path, shared_ray, "nolr", 90, "lint.ignore=[remedy-lr-cut]",
                 "megatron.args=[" + ",".join(no_lr) + "]", f"megatron.env.STANDIN_BAD_SAMPLES={bad}",
                 "megatron.env.STANDIN_ITER_S=0.02", "megatron.env.STANDIN_SKIP_ITER_S=0.02")
    assert run["code"] == 0 and no_traceback(run["output"]), run["output"][-3000:]
    climbed = [d for d in of_type(run["events"], "decision") if d["action"] != "ignore"]
    assert [d["action"] for d in climbed] == ["rollback_skip", "reset_optimizer"]
    assert "rung 2 (lower_lr, LR x 0.67) passed over: the job's arguments give no --lr" in climbed[1]["reason"]
    for event in of_type(run["events"], "event"):
        if event["kind"] == "command":
            assert "--lr" not in event["data"]["argv"]  # no sub-run was ever asked to scale one
    assert of_type(run["events"], "subrun_end")[-1]["end_state"] == "finished"


def test_absurd_numbers_in_every_field_never_crash_the_driver_and_are_recorded(tmp_path, shared_ray):
    # The table of tests/runmgr/watch/absurd_lines.py: 25 iterations whose own line holds an absurd
    # field, and 11 lines refused whole (an iteration past 2^63, of 5000 digits or past its total, a
    # save, a load and straggler reports past what can be) among the job's ordinary lines.
    from runmgr.watch.megatron_log import printable
    from tests.runmgr.watch.absurd_lines import FIELD_CASES, LINE_CASES

    total = 30
    before: dict[str, list[str]] = {}
    for case in LINE_CASES:
        before.setdefault(str(case.step), []).append(case.line(total))
    script = tmp_path / "absurd.json"
    script.write_text(json.dumps({"instead": {str(case.step): case.line(total) for case in FIELD_CASES},
                                  "before": before}))
    run = launch(tmp_path, shared_ray, "absurd", total, f"megatron.env.STANDIN_LINES={script}")
    assert run["code"] == 0 and no_traceback(run["output"]), run["output"][-3000:]
    (end,) = of_type(run["events"], "subrun_end")
    assert (end["end_state"], end["last_step"]) == ("finished", total)
    assert [i for i in incidents(run["events"]) if i["kind"] == "nonfinite"] == []  # no word read as infinity
    rows = runmgr_json_lines("logbook", "metrics", str(run["run"].run_dir), "--json")
    assert [row["step"] for row in rows] == list(range(1, total + 1))  # each step once, no absurd one
    by_step = {row["step"]: row for row in rows}
    unknown = lambda value: value is None or math.isnan(value)  # noqa: E731  # how the logbook keeps "not known"
    assert unknown(by_step[5]["loss"]) and unknown(by_step[7]["grad_norm"]) and unknown(by_step[8]["loss_scale"])
    assert unknown(by_step[23]["loss"]) and unknown(by_step[24]["grad_norm"])  # "12ab", "information"
    assert by_step[4]["loss"] == pytest.approx(5.0 - 4 * 0.01)  # the rest of an absurd field's line is kept
    assert by_step[3]["consumed_samples"] is None and by_step[22]["consumed_samples"] is None
    assert by_step[30]["consumed_samples"] == total * BATCH
    refused = [(e["data"]["field"], e["data"]["raw"]) for e in of_type(run["events"], "event")
               if e["kind"] == "refused_value"]
    assert len(refused) == len(FIELD_CASES) + len(LINE_CASES) >= 20  # every one, each named (none counted)
    assert sorted(r for r in refused if r[0] in {c.name for c in FIELD_CASES}) == sorted(
        (case.name, printable(case.raw, 100)) for case in FIELD_CASES)
    assert sorted(name for name, _ in refused if name not in {c.name for c in FIELD_CASES}) == sorted(
        case.field for case in LINE_CASES)
