"""The injector fires its schedule into real processes, once per lineage."""

from __future__ import annotations

import json

import pytest

from runmgr.chaos.build import build_chaos
from runmgr.chaos.injector import Injection
from runmgr.chaos.procfault import process_state
from runmgr.chaos.state import STATE_FILE
from runmgr.config.compose import load_run_config
from runmgr.controller.states import Finished
from tests.runmgr.chaos.conftest import poll_of, running, step_report, wait_until, worker_of


def chaos_for(tmp_path, faults: str):
    config = load_run_config("demo", [f"run.dir={tmp_path}", f"chaos.faults={faults}"])
    return build_chaos(config)


def start(injector, workers, subrun="1.00", start_step=0, skip_ranges=()):
    state = running(workers, subrun, start_step, skip_ranges)
    injector.on_transition(None, state)
    return state


def test_kill_worker_sigkills_the_rank_at_its_step_and_logs_it(tmp_path, sleeper):
    rank0, rank1 = sleeper(), sleeper()
    seen: list[Injection] = []
    injector = build_chaos(load_run_config("demo", [f"run.dir={tmp_path}", "chaos=kill_worker"])).injector(seen.append)
    state = start(injector, [worker_of(0, rank0), worker_of(1, rank1)])
    injector.on_poll(state, poll_of(step_report(28), step_report(29)))
    assert rank1.poll() is None and not seen, "fired before its step"
    injector.on_poll(state, poll_of(step_report(30)))
    assert rank1.wait(timeout=5) == -9
    assert rank0.poll() is None
    [injection] = seen
    assert (injection.kind, injection.step, injection.subrun, injection.injected) == ("kill_worker", 30, "1.00", True)
    assert f"pid {rank1.pid}" in injection.target and "SIGKILL" in injection.detail


def test_hang_rank_stops_the_process_and_a_helper_resumes_it_if_nobody_kills_it(tmp_path, sleeper):
    proc = sleeper()
    injector = chaos_for(tmp_path, "[{kind: hang_rank, at_step: 5, rank: 0, duration_s: 1.0}]").injector(lambda i: None)
    state = start(injector, [worker_of(0, proc)])
    injector.on_poll(state, poll_of(step_report(5)))
    assert wait_until(lambda: process_state(proc.pid) == "T")
    assert wait_until(lambda: process_state(proc.pid) == "S", 5.0)


def test_slow_rank_duty_cycles_the_process_for_its_duration(tmp_path, sleeper):
    proc = sleeper()
    faults = "[{kind: slow_rank, at_step: 5, rank: 0, factor: 4.0, period_s: 0.2, duration_s: 0.8}]"
    seen: list[Injection] = []
    injector = chaos_for(tmp_path, faults).injector(seen.append)
    state = start(injector, [worker_of(0, proc)])
    injector.on_poll(state, poll_of(step_report(6)))
    assert wait_until(lambda: process_state(proc.pid) == "T", 2.0)
    assert wait_until(lambda: process_state(proc.pid) == "S", 2.0)
    assert wait_until(lambda: process_state(proc.pid) == "T", 2.0), "stopped only once: not a duty cycle"
    assert "4x straggler" in seen[0].detail


def test_a_fault_fires_once_per_lineage_even_after_the_driver_restarts(tmp_path, sleeper):
    first, second = sleeper(), sleeper()
    faults = "[{kind: kill_worker, at_step: 10, rank: 0}]"
    injector = chaos_for(tmp_path, faults).injector(lambda i: None)
    state = start(injector, [worker_of(0, first)])
    injector.on_poll(state, poll_of(step_report(10)))
    assert first.wait(timeout=5) == -9
    fired = json.loads((tmp_path / STATE_FILE).read_text())["fired"]
    assert list(fired) == ["0:kill_worker@10"] and fired["0:kill_worker@10"]["step"] == 10
    # A relaunched driver (a new injector on the same run directory) rolls back past step 10 again.
    relaunched = chaos_for(tmp_path, faults).injector(lambda i: None)
    state = start(relaunched, [worker_of(0, second)], subrun="1.01", start_step=0)
    relaunched.on_poll(state, poll_of(step_report(10, "1.01"), step_report(11, "1.01")))
    assert not wait_until(lambda: second.poll() is not None, 0.3)


def test_at_subrun_holds_the_fault_until_that_sub_run(tmp_path, sleeper):
    proc = sleeper()
    injector = chaos_for(tmp_path, "[{kind: kill_worker, at_step: 3, rank: 0, at_subrun: 1}]").injector(lambda i: None)
    state = start(injector, [worker_of(0, proc)], subrun="1.00")
    injector.on_poll(state, poll_of(step_report(4)))
    assert proc.poll() is None
    injector.on_transition(state, Finished("1.00", 4))
    state = start(injector, [worker_of(0, proc)], subrun="1.01")
    injector.on_poll(state, poll_of(step_report(4, "1.01")))
    assert proc.wait(timeout=5) == -9


def test_a_missing_target_is_reported_as_not_injected_once(tmp_path, sleeper):
    proc = sleeper()
    seen: list[Injection] = []
    injector = chaos_for(tmp_path, "[{kind: kill_worker, at_step: 2, rank: 3}]").injector(seen.append)
    state = start(injector, [worker_of(0, proc)])
    injector.on_poll(state, poll_of(step_report(2)))
    injector.on_poll(state, poll_of(step_report(3)))
    [injection] = seen
    assert not injection.injected and "rank 3 is not among the 1 workers" in injection.detail
    assert proc.poll() is None


def test_a_target_already_gone_is_tried_again_in_the_next_sub_run(tmp_path, sleeper):
    gone, later = sleeper(), sleeper()
    gone.kill()
    gone.wait(timeout=5)
    seen: list[Injection] = []
    injector = chaos_for(tmp_path, "[{kind: kill_worker, at_step: 2, rank: 0}]").injector(seen.append)
    injector.on_poll(start(injector, [worker_of(0, gone)]), poll_of(step_report(2)))
    assert not seen
    injector.on_poll(start(injector, [worker_of(0, later)], subrun="1.01"), poll_of(step_report(2, "1.01")))
    assert later.wait(timeout=5) == -9 and len(seen) == 1


@pytest.mark.parametrize("skipped, expected", [(False, ["1:garbage_data@4"]), (True, [])])
def test_a_garbage_window_is_logged_when_trained_on_and_not_when_skipped(tmp_path, skipped, expected):
    seen: list[Injection] = []
    faults = "[{kind: kill_worker, at_step: 99, rank: 0}, {kind: garbage_data, at_step: 4, steps: 2}]"
    chaos = chaos_for(tmp_path, faults)
    injector = chaos.injector(seen.append)  # windows of an uninterrupted run: samples [48, 80)
    # A rollback that skips [40, 80): step 3 trains on 32..39 and 80..87, then the stream goes on.
    state = start(injector, [], skip_ranges=[(40, 80)] if skipped else [])
    ends = [16, 32, 88, 104, 120] if skipped else [16, 32, 48, 64, 80]
    reports = [step_report(step, consumed=end) for step, end in enumerate(ends, start=1)]
    injector.on_poll(state, poll_of(*reports))
    assert [i.fault for i in seen] == expected
    if expected:
        assert seen[0].step == 4 and seen[0].target == "samples [48, 80)"


def restarting(state, last_step: int, kind: str = "worker_death"):
    """The sub-run ``state`` ending for an incident of ``kind``, as the controller moves it on."""
    from runmgr.controller.judgement import Judgement
    from runmgr.controller.states import Restarting
    from runmgr.policy.decision import Decision
    from runmgr.watch.incidents import Incident

    incident = Incident(kind, 1.0, f"{kind} in {state.subrun}", subrun=state.subrun, ranks=(0,))
    return Restarting(state.subrun, state.plan, Judgement(incident, Decision("restart", kind)), last_step)


def test_a_sub_run_ended_from_outside_the_schedule_moves_the_faults_keyed_to_sub_runs_and_says_so(tmp_path, sleeper):
    """Issue 32 item 3: after a person's own kill in 1.00, each fault keyed to a sub-run meets
    the sub-run the schedule meant (its first, its second), one number later than written."""
    faults = ("[{kind: kill_worker, at_step: 5, rank: 0}, {kind: kill_worker, at_step: 4, rank: 0, at_subrun: 1}, "
              "{kind: kill_worker, at_step: 2, rank: 0, at_subrun: 2}]")
    seen: list = []
    injector = chaos_for(tmp_path, faults).injector(seen.append)
    first = start(injector, [worker_of(0, sleeper())], subrun="1.00")
    injector.on_poll(first, poll_of(step_report(1)))
    injector.on_transition(first, restarting(first, 1))  # a person's kill -9: no fault of the schedule fired
    [shift] = seen
    assert (shift.kind, shift.subrun, shift.shift) == ("schedule_shifted", "1.00", 1)
    assert shift.moved == ("1:kill_worker@4", "2:kill_worker@2")
    assert "now wait 1 sub-run later than scheduled" in shift.summary() and "person's own kill" in shift.summary()

    fired_in = {}
    for subrun, step in (("1.01", 5), ("1.02", 4), ("1.03", 2)):
        state = start(injector, [worker_of(0, sleeper())], subrun=subrun)
        for reached in range(1, step + 1):
            injector.on_poll(state, poll_of(step_report(reached, subrun)))
        fired_in[subrun] = [i.fault for i in seen if getattr(i, "subrun", None) == subrun]
        injector.on_transition(state, restarting(state, step))
    # Without the shift, 1.01 would have met both the fault of any sub-run and the one keyed to
    # sub-run 1, and 1.02 the one keyed to sub-run 2 at step 2, before its own at step 4.
    assert fired_in == {"1.01": ["0:kill_worker@5"], "1.02": ["1:kill_worker@4"], "1.03": ["2:kill_worker@2"]}
    assert [type(i).__name__ for i in seen].count("ScheduleShift") == 1
    assert json.loads((tmp_path / STATE_FILE).read_text())["unscheduled"] == ["1.00"]


def test_a_spike_the_injector_never_saw_does_not_move_the_schedule(tmp_path, sleeper):
    """A Megatron job's garbage window is in the schedule, but its log lines carry no sample
    position, so the injector never records it: the rollback it causes is the schedule's own."""
    faults = "[{kind: kill_worker, at_step: 2, rank: 0, at_subrun: 1}]"
    seen: list = []
    injector = chaos_for(tmp_path, faults).injector(seen.append)
    first = start(injector, [worker_of(0, sleeper())], subrun="1.00")
    injector.on_poll(first, poll_of(step_report(1)))
    injector.on_transition(first, restarting(first, 1, kind="loss_spike"))
    second = start(injector, [worker_of(0, sleeper())], subrun="1.01")
    injector.on_poll(second, poll_of(step_report(2, "1.01")))
    assert [(type(i).__name__, i.subrun) for i in seen] == [("Injection", "1.01")]
