"""pause_at_step: the ranks finish a step, then wait for their release, beating
``paused``; the driver hands each sub-run only the pauses still to come."""

from __future__ import annotations

import pickle
from pathlib import Path

from runmgr.chaos.build import build_chaos, release_file
from runmgr.chaos.injector import Injection
from runmgr.chaos.pause import PausingReporter, StepGate, StepPause
from runmgr.config.chaos import PAUSE_IN_CHECKPOINT
from runmgr.config.compose import load_run_config
from runmgr.workers.group import GroupPoll
from tests.runmgr.chaos.conftest import running
from tests.runmgr.chaos.test_garbage import small_config
from trainer.config import DataConfig
from trainer.distributed import DistEnv
from trainer.loop import train
from trainer.plan import ResumePlan
from trainer.report import PAUSED, Heartbeat


class Recorder:
    """Every report, in order, as (kind, step, phase)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    def started(self, report) -> None:
        self.seen.append(("started", report.start_step, ""))

    def step(self, report) -> None:
        self.seen.append(("step", report.step, ""))

    def checkpoint(self, report) -> None:
        self.seen.append(("checkpoint", report.step, ""))

    def local_norms(self, report) -> None:
        self.seen.append(("local_norms", report.step, ""))

    def heartbeat(self, beat: Heartbeat) -> None:
        self.seen.append(("beat", beat.step, beat.phase))


class FakeTime:
    """A clock that only moves when the reporter sleeps; ``on_sleep`` runs at each sleep."""

    def __init__(self, on_sleep=lambda sleeps: None) -> None:
        self.now, self.sleeps, self.on_sleep = 1000.0, 0, on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        self.on_sleep(self.sleeps)


def pause(tmp_path: Path, after_step: int = 2, timeout_s: float = 600.0, at_subrun=None) -> StepPause:
    return StepPause("0:pause_at_step@2", after_step, str(tmp_path / "release"), timeout_s, at_subrun)


def test_the_beat_that_opens_the_next_step_waits_for_the_release_file(tmp_path):
    recorder, held = Recorder(), pause(tmp_path)
    time = FakeTime(on_sleep=lambda sleeps: sleeps == 3 and Path(held.release).touch())
    reporter = PausingReporter(recorder, [held], time.clock, time.sleep)
    reporter.heartbeat(Heartbeat(1, "step", 2, 999.0))
    assert recorder.seen == [("beat", 2, "step")]
    reporter.heartbeat(Heartbeat(1, "step", 3, 999.5))
    # Three paused beats (at the finished step), then the step's own beat, stamped after the pause.
    assert recorder.seen[1:] == [("beat", 2, PAUSED)] * 3 + [("beat", 3, "step")]
    reporter.heartbeat(Heartbeat(1, "step", 4, time.now))
    assert recorder.seen[-1] == ("beat", 4, "step"), "a pause holds once"


def test_the_step_s_beat_after_a_pause_is_stamped_when_the_step_really_starts(tmp_path):
    beats: list[Heartbeat] = []
    recorder = Recorder()
    recorder.heartbeat = beats.append
    time = FakeTime(on_sleep=lambda sleeps: sleeps == 2 and Path(tmp_path / "release").touch())
    PausingReporter(recorder, [pause(tmp_path)], time.clock, time.sleep).heartbeat(Heartbeat(0, "step", 3, 1.0))
    assert beats[-1].phase == "step" and beats[-1].time == time.now  # else the pause reads as a silence


def test_a_pause_nobody_releases_ends_at_its_timeout(tmp_path):
    recorder, time = Recorder(), FakeTime()
    reporter = PausingReporter(recorder, [pause(tmp_path, timeout_s=2.0)], time.clock, time.sleep, beat_every_s=0.5)
    reporter.heartbeat(Heartbeat(0, "step", 3, 1.0))
    assert time.sleeps == 4 and recorder.seen[-1] == ("beat", 3, "step")


def test_a_released_pause_and_other_reports_pass_straight_through(tmp_path):
    (tmp_path / "release").touch()
    recorder, time = Recorder(), FakeTime()
    reporter = PausingReporter(recorder, [pause(tmp_path)], time.clock, time.sleep)
    reporter.heartbeat(Heartbeat(0, "checkpoint", 2, 1.0))
    reporter.heartbeat(Heartbeat(0, "step", 3, 1.0))
    assert time.sleeps == 0 and recorder.seen == [("beat", 2, "checkpoint"), ("beat", 3, "step")]


def test_a_sub_run_resumed_past_the_step_pauses_at_its_first_step(tmp_path):
    recorder, time = Recorder(), FakeTime(on_sleep=lambda sleeps: Path(tmp_path / "release").touch())
    reporter = PausingReporter(recorder, [pause(tmp_path, after_step=2)], time.clock, time.sleep)
    reporter.heartbeat(Heartbeat(0, "step", 11, 1.0))  # resumed from checkpoint 10
    assert recorder.seen == [("beat", 10, PAUSED), ("beat", 11, "step")]


def test_the_gate_wraps_only_sub_runs_the_pause_applies_to_and_travels_to_a_rank(tmp_path):
    gate = StepGate((pause(tmp_path, at_subrun=2),))
    plain = Recorder()
    assert gate(plain, ResumePlan(subrun="1.01")) is plain
    assert isinstance(gate(plain, ResumePlan(subrun="1.02")), PausingReporter)
    assert pickle.loads(pickle.dumps(gate)) == gate  # Ray ships it to every rank


def test_the_trainer_really_stops_between_the_two_steps(tmp_path):
    """A real (one-rank) training run: nothing of step 3 happens before the release."""
    recorder, held = Recorder(), pause(tmp_path)

    def release_once_paused(beat: Heartbeat) -> None:
        Recorder.heartbeat(recorder, beat)
        if beat.phase == PAUSED:
            Path(held.release).touch()  # the run's own state says it is paused: act, then release

    recorder.heartbeat = release_once_paused
    config = small_config(DataConfig(corpus_max_bytes=200_000), iters=4)
    train(config, ResumePlan(), StepGate((held,))(recorder, ResumePlan()), DistEnv())
    order = [entry for entry in recorder.seen if entry[0] == "step" or entry[2] in ("step", PAUSED)]
    assert order == [("beat", 1, "step"), ("step", 1, ""), ("beat", 2, "step"), ("step", 2, ""),
                     ("beat", 2, PAUSED), ("beat", 3, "step"), ("step", 3, ""), ("beat", 4, "step"), ("step", 4, "")]


def chaos_with_pause(tmp_path, at_step: int = 20):
    faults = f"[{{kind: pause_at_step, at_step: {at_step}}}]"
    return build_chaos(load_run_config("demo", [f"run.dir={tmp_path}", f"chaos.faults={faults}"]))


def test_each_sub_run_gets_the_pauses_that_have_not_fired_and_the_injector_records_one(tmp_path):
    chaos = chaos_with_pause(tmp_path)
    gate = chaos.step_gate()
    [held] = gate.pauses
    assert (held.label, held.after_step, held.timeout_s) == ("0:pause_at_step@20", 20, 600.0)
    assert held.release == str(release_file(tmp_path, held.label)) and Path(held.release).is_absolute()
    seen: list[Injection] = []
    injector = chaos.injector(seen.append)
    state = running([])
    injector.on_transition(None, state)
    injector.on_poll(state, GroupPoll(heartbeats=[Heartbeat(0, "step", 20, 1.0)]))
    assert not seen, "a rank that only started its step is not paused"
    paused = [Heartbeat(0, PAUSED, 20, 2.0), Heartbeat(1, PAUSED, 20, 2.0)]
    injector.on_poll(state, GroupPoll(heartbeats=paused))
    injector.on_poll(state, GroupPoll(heartbeats=paused))
    [injection] = seen
    assert (injection.kind, injection.step, injection.fault) == ("pause_at_step", 20, "0:pause_at_step@20")
    assert held.release in injection.detail
    assert chaos.step_gate() is None, "fired once per lineage: the next sub-run does not pause again"
    assert chaos_with_pause(tmp_path).step_gate() is None, "nor does a relaunched driver's"


def test_a_schedule_without_pauses_hands_the_ranks_nothing(tmp_path):
    config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=kill_worker"])
    assert build_chaos(config).step_gate() is None
    assert not list(tmp_path.iterdir())


def test_a_checkpoint_hold_waits_in_rank_0_s_beat_before_the_commit_of_its_checkpoint(tmp_path):
    """pause_in_checkpoint: not the beat that starts checkpoint 2, not another rank's,
    but rank 0's first checkpoint beat after step 2: the one before 2's commit."""
    recorder = Recorder()
    held = StepPause.of_kind(PAUSE_IN_CHECKPOINT, "0:pause_in_checkpoint@2", 2, str(tmp_path / "release"), 600.0, None)
    time = FakeTime(on_sleep=lambda sleeps: sleeps == 2 and Path(held.release).touch())
    reporter = PausingReporter(recorder, [held], time.clock, time.sleep)
    for beat in (Heartbeat(0, "checkpoint", 2, 1.0), Heartbeat(0, "step", 3, 1.0), Heartbeat(1, "checkpoint", 3, 1.0)):
        reporter.heartbeat(beat)
    assert time.sleeps == 0
    reporter.heartbeat(Heartbeat(0, "checkpoint", 3, 1.0))
    assert recorder.seen[-3:] == [("beat", 3, PAUSED)] * 2 + [("beat", 3, "checkpoint")]


def test_the_injector_records_a_checkpoint_hold_as_such(tmp_path):
    faults = "[{kind: pause_in_checkpoint, at_step: 20}]"
    chaos = build_chaos(load_run_config("demo", [f"run.dir={tmp_path}", f"chaos.faults={faults}"]))
    [held] = chaos.step_gate().pauses
    assert held.in_checkpoint and held.kind == PAUSE_IN_CHECKPOINT
    seen: list[Injection] = []
    injector = chaos.injector(seen.append)
    state = running([])
    injector.on_transition(None, state)
    injector.on_poll(state, GroupPoll(heartbeats=[Heartbeat(0, PAUSED, 21, 2.0)]))
    [injection] = seen
    assert (injection.kind, injection.target, injection.step) == ("pause_in_checkpoint", "rank 0", 21)
    assert "before committing the checkpoint of step 20" in injection.detail
