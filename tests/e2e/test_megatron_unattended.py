"""A user's own Megatron job left unattended (issue 26, red-team issue 33): real ``runmgr launch``
runs of a stand-in ``pretrain_gpt.py`` (tests/e2e/standin/) under a real torchrun per node through
Ray, each case as a user met it:

- a flag the script refuses ends the run after one try as needing a person, in the job's words;
- the iterations a rollback asked Megatron to skip are silent, and that silence is not a hang;
- a job that finishes is finished, even when one node ends well before the other;
- a job that exits 0 before ``--train-iters`` is an incident: restarted from what it saved, and a
  person is needed when it saved nothing new (or never printed an iteration line at all);
- a job that prints nothing at all needs a person after one try, its stacks dumped;
- absurd numbers in every field of its lines never crash the driver, each refused value recorded.

A forced LR cut on a job without ``--lr`` is a decision and a command line, no outcome of the
torchrun: tests/runmgr/megatron/test_lr_cut_passed_over.py steps the launch's own runner and judge.

Each case is one short launch on the session's shared Ray, of one node of one rank unless it is
about several: the uneven finish takes two nodes of one rank (and carries the absurd numbers' lines
on the same launch: one job, two outcomes), the silent job two ranks on one node (every rank's
stacks). Each node costs a torchrun and each rank a torch import per sub-run; how a job's stacks
are gathered from several nodes is checked in tests/runmgr/workers/test_megatron_group.py.
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


def launch(tmp_path: Path, shared_ray, name: str, train_iters: int, *overrides: str, extra_args=(),
           nodes: int = 1, ranks_per_node: int = 1) -> dict:
    """One launch of the stand-in on ``nodes`` nodes (a torchrun each) of ``ranks_per_node`` ranks;
    its exit code, console output and logbook events."""
    run_dir = tmp_path / name
    base = ["chaos=none", "watcher=demo", "policy=demo", "health.skip=true",
            f"cluster.num_workers={nodes * ranks_per_node}", f"megatron.nproc_per_node={ranks_per_node}",
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


TOTAL = 30


def absurd_lines(where: Path) -> Path:
    """The table of tests/runmgr/watch/absurd_lines.py as the stand-in's STANDIN_LINES: 25 iterations
    whose own line holds an absurd field, and 11 lines refused whole (an iteration past 2^63, of 5000
    digits or past its total, a save, a load and straggler reports past what can be) among the job's
    ordinary lines."""
    from tests.runmgr.watch.absurd_lines import FIELD_CASES, LINE_CASES

    before: dict[str, list[str]] = {}
    for case in LINE_CASES:
        before.setdefault(str(case.step), []).append(case.line(TOTAL))
    script = where / "absurd.json"
    script.write_text(json.dumps({"instead": {str(case.step): case.line(TOTAL) for case in FIELD_CASES},
                                  "before": before}))
    return script


@pytest.fixture(scope="module")
def uneven_finish(tmp_path_factory, shared_ray) -> dict:
    """One job of two nodes that finishes unevenly while its last rank prints the absurd table:
    rank 1 (node 1) exits right after the last iteration; rank 0 stays 8 s more (its teardown),
    longer than the demo's hang window, printing one line at its end. (The environment is given as
    one mapping, megatron.env={K: V, ...}, as a user would write it.) Two cases of the module read
    it: the finish and the absurd numbers, which neither needs a launch of its own to show."""
    where = tmp_path_factory.mktemp("unattended")
    script = absurd_lines(where)
    return launch(where, shared_ray, "finish", TOTAL,
                  f"megatron.env={{STANDIN_SLOW_FINISH_RANK: 0, STANDIN_SLOW_FINISH_S: 8, STANDIN_LINES: '{script}'}}",
                  nodes=2)


def test_a_job_that_finishes_is_finished_though_one_node_ends_long_before_the_other(uneven_finish):
    run = uneven_finish
    assert run["code"] == 0 and no_traceback(run["output"]), run["output"][-3000:]
    assert incidents(run["events"]) == []
    envs = [e["data"]["env"] for e in of_type(run["events"], "event") if e["kind"] == "command"]
    assert len(envs) == 2 and all(env["STANDIN_SLOW_FINISH_S"] == "8" for env in envs)  # the mapping reached each node
    (end,) = of_type(run["events"], "subrun_end")
    assert (end["subrun"], end["end_state"], end["last_step"]) == ("1.00", "finished", TOTAL)


def test_absurd_numbers_in_every_field_never_crash_the_driver_and_are_recorded(uneven_finish):
    # The table's lines, printed by the uneven finish's last rank (absurd_lines above).
    from runmgr.watch.megatron_log import printable
    from tests.runmgr.watch.absurd_lines import FIELD_CASES, LINE_CASES

    run = uneven_finish
    assert run["code"] == 0 and no_traceback(run["output"]), run["output"][-3000:]
    (end,) = of_type(run["events"], "subrun_end")
    assert (end["end_state"], end["last_step"]) == ("finished", TOTAL)
    assert [i for i in incidents(run["events"]) if i["kind"] == "nonfinite"] == []  # no word read as infinity
    rows = runmgr_json_lines("logbook", "metrics", str(run["run"].run_dir), "--json")
    assert [row["step"] for row in rows] == list(range(1, TOTAL + 1))  # each step once, no absurd one
    by_step = {row["step"]: row for row in rows}
    unknown = lambda value: value is None or math.isnan(value)  # noqa: E731  # how the logbook keeps "not known"
    assert unknown(by_step[5]["loss"]) and unknown(by_step[7]["grad_norm"]) and unknown(by_step[8]["loss_scale"])
    assert unknown(by_step[23]["loss"]) and unknown(by_step[24]["grad_norm"])  # "12ab", "information"
    assert by_step[4]["loss"] == pytest.approx(5.0 - 4 * 0.01)  # the rest of an absurd field's line is kept
    assert by_step[3]["consumed_samples"] is None and by_step[22]["consumed_samples"] is None
    assert by_step[TOTAL]["consumed_samples"] == TOTAL * BATCH
    refused = [(e["data"]["field"], e["data"]["raw"]) for e in of_type(run["events"], "event")
               if e["kind"] == "refused_value"]
    assert len(refused) == len(FIELD_CASES) + len(LINE_CASES) >= 20  # every one, each named (none counted)
    assert sorted(r for r in refused if r[0] in {c.name for c in FIELD_CASES}) == sorted(
        (case.name, printable(case.raw, 100)) for case in FIELD_CASES)
    assert sorted(name for name, _ in refused if name not in {c.name for c in FIELD_CASES}) == sorted(
        case.field for case in LINE_CASES)


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
                 "watcher.hang.init={initial_s: 4.0, min_s: 1.0, max_s: 60.0}", ranks_per_node=2)
    assert run["code"] == 1 and no_traceback(run["output"]), run["output"][-3000:]
    (hang,) = incidents(run["events"])
    assert hang["kind"] == "hang" and evidence(hang)["never_stepped"] is True
    (decision,) = of_type(run["events"], "decision")
    assert decision["action"] == "abort" and "not printed a single iteration line" in decision["reason"]
    assert "it printed nothing" in decision["reason"]
    assert [s["subrun"] for s in of_type(run["events"], "subrun_start")] == ["1.00"]
    dumped = [e for e in of_type(run["events"], "event") if e["kind"] == "stacks_dumped"]
    assert dumped and sorted(dumped[0]["data"]["files"]) == ["rank0.txt", "rank1.txt"]
