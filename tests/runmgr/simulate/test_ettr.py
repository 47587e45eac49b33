"""The ETTR simulator drives the real controller and policy over a simulated clock and
worker group: checked against Daly's closed form on a simple case (one failure class,
exponential failures, fixed costs), and Young's interval is the best one swept."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from runmgr.simulate.assumptions import EttrAssumptions
from runmgr.simulate.ettr import best, failures_for, simulate, sweep_intervals
from runmgr.simulate.failures import LLAMA3_TABLE5, FailureClass, draw_failures

MTBF_S, STALL_S, RESTART_S = 3600.0, 5.0, 60.0
KILLED = FailureClass("Killed", 1, "The actor died unexpectedly before finishing this task.", "process")
# One node of 8 ranks, 1 s steps, ~2,000 failures: the statistics of the waste are tight.
SIMPLE = EttrAssumptions(devices=8, devices_per_node=8, days=2000 * MTBF_S / 86_400, step_time_s=1.0,
                         checkpoint_stall_s=STALL_S, detect_s=0.0, cold_restart_s=RESTART_S, warm_spares=0)


def daly_ettr(interval_s: float) -> float:
    """Daly (2006): expected wall time of ``interval_s`` of work between checkpoints of cost
    ``STALL_S``, exponential failures of mean ``MTBF_S``, each followed by a restart of
    ``RESTART_S`` that a failure may also strike: MTBF e^(R/MTBF) (e^((tau+delta)/MTBF) - 1)."""
    wall = MTBF_S * math.exp(RESTART_S / MTBF_S) * (math.exp((interval_s + STALL_S) / MTBF_S) - 1)
    return interval_s / wall


def simple_failures(seed: int = 7):
    span = SIMPLE.train_steps * SIMPLE.step_time_s * 1.5
    return draw_failures(SIMPLE.devices, span, random.Random(seed), (KILLED,), 1 / (MTBF_S * SIMPLE.devices))


def test_the_cold_path_matches_daly_s_closed_form_and_young_s_interval_is_the_best():
    young = math.sqrt(2 * STALL_S * MTBF_S)  # 190 s = 190 steps of 1 s
    intervals = [50, 100, round(young), 400, 800]
    results = sweep_intervals(SIMPLE, False, intervals, simple_failures())
    for result in results:
        expected = daly_ettr(result.checkpoint_interval_steps * SIMPLE.step_time_s)
        # Within a tenth of the waste (about 2,200 failures: the counts' noise is ~2% of it).
        assert abs(result.ettr - expected) < 0.1 * (1 - expected), (result.checkpoint_interval_steps, result.ettr,
                                                                    expected)
        assert result.failures > 1900 and result.warm_restarts == 0
    assert best(results).checkpoint_interval_steps == round(young)
    # Where the time went adds up to the wall time.
    top = best(results)
    parts = top.productive_s + top.checkpoint_stalls_s + top.restarts_s + top.lost_work_s + top.detection_s
    assert math.isclose(parts, top.wall_s, rel_tol=1e-9)


def test_the_policy_decides_warm_restarts_only_while_spares_are_ready():
    small = EttrAssumptions(devices=64, days=20.0, failure_scale=300.0, warm_spares=8, spare_refill_s=120.0)
    failures = failures_for(small, seed=3)
    warm = simulate(small, True, failures)
    cold = simulate(small, False, failures)
    assert warm.warm_restarts > 0 and cold.warm_restarts == 0 and cold.cold_restarts == cold.failures
    assert warm.ettr > cold.ettr
    assert warm.steps_redone < cold.steps_redone
    # Without spares every restart is cold, whatever the path.
    none = simulate(replace(small, warm_spares=0), True, failures)
    assert none.warm_restarts == 0 and none.cold_restarts == none.failures


def test_llama3_classes_are_judged_by_the_real_death_classifier_into_exclusions_and_restarts():
    from runmgr.config.policy import PolicyConfig
    from runmgr.watch.deaths import classify

    actions = {c.component: PolicyConfig().death_actions[classify(c.text).category] for c in LLAMA3_TABLE5}
    assert actions["Faulty GPU"] == actions["GPU HBM3 Memory"] == actions["Host Maintenance"] == "exclude_node"
    assert actions["Software Bug"] == actions["NCCL Watchdog Timeouts"] == actions["Network Switch/Cable"] == "restart"
    assert "abort" not in actions.values()


def test_reported_every_step_a_sub_run_reports_each_step_once_from_its_start_and_the_result_is_the_same():
    small = EttrAssumptions(devices=64, days=2.0, failure_scale=300.0, warm_spares=0)
    failures = failures_for(small, seed=5)

    class Steps:
        """An observer keeping each sub-run's reported steps."""

        def __init__(self):
            self.by_subrun, self.starts = {}, {}

        def on_transition(self, old, new):
            if type(new).__name__ == "Running":
                self.starts[new.subrun] = new.start_step

        def on_poll(self, state, poll):
            self.by_subrun.setdefault(state.subrun, []).extend(r.step for r in poll.steps)

        def on_judgement(self, state, judgement):
            pass

    seen = Steps()
    every = simulate(small, False, failures, observers=[seen], every_step=True)
    assert every == simulate(small, False, failures)  # reporting each step changes nothing simulated
    assert len(seen.starts) == every.failures + 1
    for subrun, start in seen.starts.items():
        steps = seen.by_subrun.get(subrun, [])
        assert steps == list(range(start + 1, start + 1 + len(steps)))  # each step once, from its start on
    assert seen.by_subrun[max(seen.by_subrun)][-1] == small.train_steps
