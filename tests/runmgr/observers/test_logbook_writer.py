"""The real LogbookObserver, fed by the controller stepped over fake worker
groups: what reaches the logbook is what a run's transitions and judgements
were, and `runmgr logbook show` tells that story."""

from __future__ import annotations

import io

from logbook import Logbook
from logbook.cli import show
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Finished, Launching, Running
from runmgr.observers.logbook_writer import REFUSALS_PER_FIELD, LogbookObserver
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation, RefusedValue
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport

CONFIG = {"training": {"train_iters": 30}}


def checkpoint(step: int, subrun: str = "1.00") -> CheckpointReport:
    return CheckpointReport(subrun, step, f"/run/checkpoints/step_{step:08d}", 0.5, 1000.0 + step)


def run_with_a_death_and_an_exclusion(book: Logbook):
    """1.00 trains to 25 and loses rank 1; 1.01 sees an ECC error on node1 at step 28
    (no spare: data parallel shrinks); 1.02 finishes."""
    first = FakeGroup([GroupPoll(steps=[step_report(s) for s in range(1, 21)], checkpoints=[checkpoint(20)]),
                       GroupPoll(steps=[step_report(s) for s in range(21, 26)], failures=[died(1)])])
    second = FakeGroup([GroupPoll(steps=[step_report(s, subrun="1.01") for s in range(21, 29)])])
    third = FakeGroup([GroupPoll(steps=[step_report(s, subrun="1.02") for s in range(21, 31)]),
                       GroupPoll(finished_ranks=[0])])
    points = {25: ResumePoint("/run/checkpoints/step_00000020", 20), 28: ResumePoint("/run/checkpoints/step_00000020", 20)}
    controller, _ = make_controller([first, second, third], points=points, slots={"node0": 1, "node1": 1},
                                    observers=(LogbookObserver(book, CONFIG),))
    ecc = [DeviceObservation("node1", 0, "ecc", 2000.0, correctable=0, uncorrectable=2)]
    controller.read_devices = lambda: ecc if controller.state.subrun == "1.01" else []
    return controller.run()


def test_the_lineage_records_each_subrun_with_its_cause_plan_and_end(tmp_path):
    with Logbook.open(tmp_path) as book:
        final = run_with_a_death_and_an_exclusion(book)
        lineage = book.lineage()
    assert isinstance(final, Finished) and final.last_step == 30
    assert [(s.id, s.end_state, s.last_step) for s in lineage] == [
        ("1.00", "restarting", 25), ("1.01", "restarting", 28), ("1.02", "finished", 30)]
    assert lineage[1].start_step == 20 and lineage[1].evidence["decision"]["action"] == "restart"
    assert lineage[2].plan["avoid_nodes"] == ["node1"] and lineage[2].plan["data_parallel_size"] == 1


def test_incidents_decisions_metrics_and_checkpoints_are_rows(tmp_path):
    with Logbook.open(tmp_path) as book:
        run_with_a_death_and_an_exclusion(book)
        events = book.events()
        kept = book.kept_metrics()
    decisions = [(e["subrun"], e["action"]) for e in events if e["type"] == "decision"]
    assert decisions == [("1.00", "restart"), ("1.01", "exclude_node")]
    shrink = next(e for e in events if e["type"] == "decision" and e["action"] == "exclude_node")
    assert "data parallel shrinks 2 -> 1" in shrink["reason"] and shrink["plan"]["data_parallel_size"] == 1
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [20]
    # the kept lineage has each step once, from the sub-run that kept it
    assert [row["step"] for row in kept] == list(range(1, 31))
    assert {row["step"]: row["subrun"] for row in kept}[25] == "1.02"


def test_show_tells_the_story(tmp_path):
    with Logbook.open(tmp_path) as book:
        run_with_a_death_and_an_exclusion(book)
    out = io.StringIO()
    assert show(tmp_path, out) == 0
    text = out.getvalue()
    for expected in ("1.00", "1.01", "1.02", "worker_death", "device_fault", "exclude_node", "finished"):
        assert expected in text, expected


def test_the_command_of_each_node_is_recorded_so_a_person_can_rerun_it(tmp_path):
    command = {"node_rank": 0, "argv": ["python", "-m", "torch.distributed.run", "--nnodes", "1",
                                        "pretrain_gpt.py", "--lr", "1.5e-4", "--data-path", "/data/my corpus"],
               "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "WANDB_API_KEY": "***"}}
    group = FakeGroup([GroupPoll(steps=[step_report(s) for s in range(1, 31)], commands=[command]),
                       GroupPoll(finished_ranks=[0, 1])])
    with Logbook.open(tmp_path) as book:
        controller, _ = make_controller([group], observers=(LogbookObserver(book, CONFIG),))
        controller.run()
        events = [e for e in book.events() if e["type"] == "event" and e["kind"] == "command"]
    assert len(events) == 1 and events[0]["subrun"] == "1.00" and events[0]["data"] == command
    line = events[0]["message"]
    assert line.startswith("node 0: CUDA_DEVICE_MAX_CONNECTIONS=1 WANDB_API_KEY='***' python -m torch.distributed.run")
    assert "'/data/my corpus'" in line  # quoted: it pastes into a shell as one argument


def test_a_rehearsal_is_marked_in_the_title_and_its_first_subrun_records_the_mapping(tmp_path):
    """``runmgr launch --rehearse``: the chronicle's title says whose rehearsal it is, and the
    first sub-run has a ``rehearsal`` event whose data is every key (real, rehearsal, why)."""
    from pathlib import Path

    from runmgr.config.compose import config_as_dict
    from runmgr.rehearsal import load_rehearsal
    from runmgr.controller.states import Launching
    from trainer.plan import ResumePlan

    conf = Path(__file__).resolve().parents[3] / "conf"
    config, mapping = load_rehearsal("run12", [], conf)
    with Logbook.open(tmp_path) as book:
        observer = LogbookObserver(book, config_as_dict(config))
        observer.on_transition(None, Launching("12.00", ResumePlan(subrun="12.00"), 0, "launch",
                                               {"rehearsal": mapping.to_dict()}))
        event = next(e for e in book.events() if e.get("kind") == "rehearsal")
    assert event["subrun"] == "12.00" and event["data"]["of"] == "run12"
    tp = next(row for row in event["data"]["rows"] if row["key"] == "parallel.tensor_model_parallel_size")
    assert (tp["real"], tp["rehearsal"]) == (8, 2)
    out = io.StringIO()
    show(tmp_path, out)
    text = out.getvalue()
    assert text.splitlines()[0] == "run12-rehearsal — run 12 — a rehearsal of run12 (runmgr launch --rehearse)"
    assert "rehearsal: a rehearsal of run12:" in text and "parallel.tensor_model_parallel_size 8 -> 2" in text


class SeenStatus:
    """After the status file's observer: the status at every poll."""

    def __init__(self, run_dir) -> None:
        self.run_dir = run_dir
        self.polls: list[dict] = []

    def on_transition(self, old, new) -> None:
        pass

    def on_judgement(self, state, judgement) -> None:
        pass

    def on_poll(self, state, poll) -> None:
        from runmgr.status import read_status

        self.polls.append(read_status(self.run_dir))


def test_a_warm_groups_spares_are_events_a_person_reads_and_the_status_counts_them(tmp_path):
    from runmgr.controller.group import SpareEvent, WorkerInfo
    from runmgr.observers.status_file import StatusFileObserver
    from runmgr.policy.warm import WarmCover
    from runmgr.status import render_status
    from tests.runmgr.controller.fakes import FakeWarmGroup

    spare = WorkerInfo(-1, 300, "node2", "127.0.0.1")
    ready = SpareEvent("spare_ready", "warm spare ready on node node2 (pid 300) (1 of 1 ready)", 1, 1, spare)
    refilling = SpareEvent("spare_refilling", "a new warm spare starts on node node0 in the slot rank 0 left, to "
                                              "replace the spare it took (0 of 1 ready)", 0, 1)
    cover = WarmCover(27, {0: "node0", 1: "node1"}, {0: ("node0", "node1"), 1: ("node0", "node1")}, {"node2": 1})
    group = FakeWarmGroup([GroupPoll(steps=[step_report(27)], spare_events=[ready], ready_spares=1),
                           GroupPoll(failures=[died(0)]),
                           GroupPoll(steps=[step_report(s, subrun="1.01") for s in range(28, 31)],
                                     spare_events=[refilling], ready_spares=0),
                           GroupPoll(finished_ranks=[0, 1], ready_spares=0)], cover)
    status = StatusFileObserver(tmp_path, "demo", 30, 0)
    seen = SeenStatus(tmp_path)
    with Logbook.open(tmp_path) as book:
        controller, _ = make_controller([group], observers=(LogbookObserver(book, CONFIG), status, seen))
        controller.run()
        events = [e for e in book.events() if e["type"] == "event" and e["kind"].startswith("spare_")]
    assert [(e["subrun"], e["kind"], e["message"], e["data"]["ready"]) for e in events] == [
        ("1.00", "spare_ready", ready.text, 1), ("1.01", "spare_refilling", refilling.text, 0)]
    assert events[0]["data"]["worker"] == spare.to_dict()
    assert [(s["subrun"], s["ready_spares"]) for s in seen.polls] == [("1.00", 1), ("1.00", 1), ("1.01", 0),
                                                                       ("1.01", 0)]
    assert "warm spares ready: 1" in render_status(seen.polls[0])
    out = io.StringIO()
    assert show(tmp_path, out) == 0
    assert "spare_refilling: a new warm spare starts on node node0" in out.getvalue()


def test_refused_values_are_events_a_few_per_field_then_one_count_when_the_subrun_ends(tmp_path):
    # A job that prints nothing but garbage must not write an event per line (issue 33).
    plan = ResumePlan(subrun="1.00")
    running = Running("1.00", plan, 0)
    loss = [RefusedValue("1.00", 1000.0 + n, "lm loss", "-1", "below 0", f" iteration {n}/ 30 | lm loss: -1 |")
            for n in range(1, 13)]
    scale = [RefusedValue("1.00", 1000.0, "loss scale", "0.0", "not above 0", " iteration 3/ 30 | loss scale: 0.0 |")]
    with Logbook.open(tmp_path) as book:
        writer = LogbookObserver(book, CONFIG)
        writer.on_transition(None, Launching("1.00", plan, 0, "launch"))
        writer.on_transition(None, running)
        writer.on_poll(running, GroupPoll(observations=loss[:7] + scale))
        writer.on_poll(running, GroupPoll(observations=loss[7:]))
        writer.on_transition(running, Finished("1.00", 30))
        events = [e for e in book.events() if e["type"] == "event" and e["kind"].startswith("refused_value")]
    one_by_one = [(e["data"]["field"], e["data"]["raw"]) for e in events if e["kind"] == "refused_value"]
    assert one_by_one == [("lm loss", "-1")] * REFUSALS_PER_FIELD + [("loss scale", "0.0")]
    (counted,) = [e for e in events if e["kind"] == "refused_values"]
    assert counted["data"] == {"field": "lm loss", "count": 12} and "7 more values of lm loss" in counted["message"]


def test_a_large_jobs_workers_are_recorded_per_node_and_told_as_a_count(tmp_path):
    from logbook.render import workers_text
    from runmgr.controller.group import WorkerInfo
    from runmgr.observers.logbook_writer import WORKERS_LISTED, rank_ranges, workers_record

    few = [WorkerInfo(rank, 100 + rank, f"node{rank // 8}", "10.0.0.1") for rank in range(8)]
    assert workers_record(few) == {"workers": [w.to_dict() for w in few]}  # each, with its pid
    # 2,048 ranks on 256 nodes; after a warm restart a spare on node 255 holds rank 5.
    many = [WorkerInfo(rank, 100 + rank, f"node{rank // 8}", f"10.0.{rank // 8}.1") for rank in range(2048)]
    many[5] = WorkerInfo(5, 9999, "node255", "10.0.255.1")
    record = workers_record(many)
    assert len(many) > WORKERS_LISTED and record["worker_count"] == 2048 and len(record["nodes"]) == 256
    assert record["nodes"]["node0"] == {"node_ip": "10.0.0.1", "ranks": "0-4,6-7"}
    assert record["nodes"]["node255"]["ranks"] == "5,2040-2047"
    assert rank_ranges([3]) == "3" and rank_ranges([1, 2]) == "1-2"
    event = {"time": 12.0, "message": "2048 workers started", "data": record}
    assert workers_text(event, started_at=10.0).startswith("2048 workers up in 2")
