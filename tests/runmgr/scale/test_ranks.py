"""The simulated ranks' schedule (runmgr/scale/ranks.py): what the driver would hear of a
lockstep data-parallel job, computed from a clock, once each."""

from __future__ import annotations

from runmgr.scale.ranks import JobScript, RankFault, RankView, SubrunSchedule
from trainer.report import CheckpointReport, Heartbeat, StepReport


def schedule(*faults: RankFault, start_step: int = 0, final_step: int = 10, world: int = 4) -> SubrunSchedule:
    script = JobScript(world=world, step_s=1.0, save_interval=5, init_s=0.5, faults=faults)
    return SubrunSchedule(script, "1.00", start_step, final_step, 100.0, faults)


def kinds(items) -> list[str]:
    return [kind for kind, _ in items]


def test_ranks_step_in_lockstep_and_each_report_comes_once():
    s = schedule()
    assert s.start_of(1) == 100.5 and s.start_of(3) == 102.5 and s.finished_at() == 110.5
    rank0, rank3 = RankView(s, 0), RankView(s, 3)
    first = rank0.since(102.6)  # steps 1-3 started, 1-2 ended
    assert kinds(first) == ["heartbeat", "started", "heartbeat", "heartbeat", "heartbeat", "step", "step"]
    assert [r.step for k, r in first if k == "step"] == [1, 2]
    assert rank0.since(102.6) == []  # nothing new at the same moment
    later = rank0.since(106.0)
    assert [r.step for k, r in later if k == "step"] == [3, 4, 5]
    assert [r.step for k, r in later if k == "checkpoint"] == [5]
    beats = [r for k, r in rank3.since(106.0) if k == "heartbeat"]
    assert [(b.phase, b.step) for b in beats] == [("init", 0)] + [("step", n) for n in range(1, 7)]
    assert all(k == "heartbeat" for k, _ in rank3.since(107.0))  # only rank 0 reports steps


def test_a_straggler_lengthens_every_step_from_its_fault_and_stands_out_in_the_compute_times():
    s = schedule(RankFault("slow", 2, 4, factor=3.0))
    assert s.duration(3) == 1.0 and s.duration(4) == 3.0
    steps = {r.step: r for k, r in RankView(s, 0).since(120.0) if isinstance(r, StepReport)}
    assert max(steps[3].compute_times) < 1.0 and steps[3].step_time == 1.0
    slow = steps[6].compute_times
    assert slow.index(max(slow)) == 2 and max(slow) > 2.5 * sorted(slow)[1]


def test_a_kill_or_a_hang_stops_every_rank_inside_its_step():
    s = schedule(RankFault("kill", 1, 3), RankFault("hang", 0, 6))
    assert s.stall_step == 3 and s.finished_at() is None
    assert s.fault_time(RankFault("kill", 1, 3)) == 103.0  # halfway through step 3
    items = RankView(s, 0).since(200.0)
    assert max(r.step for k, r in items if isinstance(r, Heartbeat)) == 3  # it entered step 3 ...
    assert max(r.step for k, r in items if isinstance(r, StepReport)) == 2  # ... and never ended it
    assert [f.kind for f in s.met(200.0)] == ["kill"]  # the hang lies beyond the stall


def test_a_sub_run_resumed_past_a_fault_does_not_meet_it_again():
    s = schedule(RankFault("kill", 1, 3), start_step=5)
    assert s.stall_step is None and s.met(200.0) == ()
    items = RankView(s, 0).since(200.0)
    assert [r.step for k, r in items if isinstance(r, CheckpointReport)] == [10]
    assert items[1][1].start_step == 5
