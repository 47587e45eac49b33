"""The instability ladder: record, roll back and skip, lower the LR, reset Adam, then a human."""

from __future__ import annotations

import dataclasses

from trainer.plan import SkipRange

from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.config.policy import InstabilityConfig, PolicyConfig, RollbackConfig, Rung
from runmgr.policy.decision import ABORT, IGNORE, LOWER_CLIP, LOWER_LR, RESET_OPTIMIZER, ROLLBACK_SKIP
from runmgr.policy.abilities import BUILTIN_ABILITIES
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.watch.incidents import LOSS_SPIKE, NONFINITE, Incident

BATCH = 256
CHECKPOINTS = tuple(VerifiedCheckpoint(step, step * BATCH) for step in range(500, 10001, 500))


def spike(onset, subrun="12.00", recovered=False, kind=LOSS_SPIKE, time=0.0):
    return Incident(kind=kind, time=time, description=f"loss rose at step {onset + 5}", subrun=subrun,
                    onset_step=onset, peak_step=onset + 5, recovered=recovered, onset_sample=(onset - 1) * BATCH,
                    samples_per_step=BATCH, evidence={"grace_steps": 50, "resolved_step": onset + 50,
                                                      "peak_rise": 0.6})


def climb(onsets, config=PolicyConfig(), checkpoints=CHECKPOINTS):
    """Decide each onset in its own sub-run, as a controller would; returns the decisions."""
    history, decisions = History(), []
    for number, onset in enumerate(onsets):
        incident = spike(onset, subrun=f"12.{number:02d}")
        decision = decide(incident, history, config, checkpoints)
        history = history.record(incident, decision, checkpoints)
        decisions.append(decision)
    return decisions


def test_a_spike_that_recovered_within_grace_is_recorded_not_rolled_back():
    decision = decide(spike(3000, recovered=True), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == IGNORE and not decision.restarts
    assert "recovered by itself 50 steps after its onset at step 3000" in decision.reason


def test_a_persistent_spike_rolls_back_a_margin_before_onset_and_skips_samples_around_it():
    decision = decide(spike(3050), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == ROLLBACK_SKIP
    # Newest verified checkpoint at least 100 steps before the onset: 2500 (3000 is only 50 before).
    assert decision.restart_from_step == 2500
    onset_sample = 3049 * BATCH
    assert decision.skip_ranges == (SkipRange(onset_sample - 100 * BATCH, onset_sample + 200 * BATCH),)
    assert decision.lr_factor == 1.0 and not decision.reset_optimizer
    assert "restart from verified checkpoint 2500 (550 steps before onset, margin 100)" in decision.reason
    assert f"skip samples [{onset_sample - 100 * BATCH}, {onset_sample + 200 * BATCH})" in decision.reason


def test_the_skip_window_never_starts_before_the_restart_checkpoint():
    config = PolicyConfig(rollback=RollbackConfig(margin_steps=100, skip_before_steps=300, skip_after_steps=200))
    decision = decide(spike(3150), History(), config, CHECKPOINTS)
    assert decision.restart_from_step == 3000
    # 300 steps before the onset is step 2850, already trained on before checkpoint 3000.
    assert decision.skip_ranges == (SkipRange(3000 * BATCH, 3149 * BATCH + 200 * BATCH),)


def test_again_within_the_window_lowers_the_lr_then_resets_adam():
    first, second, third = climb([3050, 3010, 2990])
    assert [d.action for d in (first, second, third)] == [ROLLBACK_SKIP, LOWER_LR, RESET_OPTIMIZER]
    assert second.lr_factor == 0.67 and second.restart_from_step == 2500 and second.skip_ranges
    assert "LR scale 1 -> 0.67 for the rest of the run" in second.reason
    assert third.reset_optimizer and third.rewarmup_iters == 200 and third.lr_factor == 1.0
    assert "reset Adam's moments, keep the weights" in third.reason
    assert "instability 3 in a row (earlier onsets within 1000 steps: 3050, 3010)" in third.reason


def test_a_re_warmup_takes_at_most_a_tenth_of_the_steps_left_and_says_so():
    reset_first = PolicyConfig(instability=InstabilityConfig(ladder=(
        Rung(action=RESET_OPTIMIZER, max_uses=2, skip_data=True, rewarmup_iters=200),)))
    short = decide(spike(3050), History(), reset_first, CHECKPOINTS, final_step=3500)  # restart at 2500
    assert short.rewarmup_iters == 100
    assert ("re-warm up over 100 steps (the rung's 200, cut to a tenth of the 1000 steps left after the "
            "restart)") in short.reason
    long_run = decide(spike(3050), History(), reset_first, CHECKPOINTS, final_step=150000)
    unknown = decide(spike(3050), History(), reset_first, CHECKPOINTS)
    assert long_run.rewarmup_iters == unknown.rewarmup_iters == 200 and "cut to" not in long_run.reason


def test_an_instability_far_from_the_previous_one_starts_again_at_the_first_rung():
    decisions = climb([3050, 3010, 6000])
    assert [d.action for d in decisions] == [ROLLBACK_SKIP, LOWER_LR, ROLLBACK_SKIP]


def test_lr_cuts_compound_and_are_quoted():
    ladder = (Rung(action=ROLLBACK_SKIP), Rung(action=LOWER_LR, lr_factor=0.5, max_uses=5))
    config = PolicyConfig(instability=InstabilityConfig(ladder=ladder, repeat_window_steps=1000))
    checkpoints = CHECKPOINTS + tuple(VerifiedCheckpoint(s, s * BATCH) for s in (3100, 3200, 3300))
    decisions = climb([3250, 3350, 3450], config, checkpoints)  # each rollback finds a newer checkpoint
    assert [d.action for d in decisions] == [ROLLBACK_SKIP, LOWER_LR, LOWER_LR]
    assert "LR scale 0.5 -> 0.25" in decisions[2].reason


def test_a_lower_clip_rung_sets_the_clip_for_the_rest_of_the_run():
    ladder = (Rung(action=LOWER_CLIP, clip_grad=0.3),)
    decision = climb([3050], PolicyConfig(instability=InstabilityConfig(ladder=ladder)))[0]
    assert decision.action == LOWER_CLIP and decision.clip_grad == 0.3
    assert "gradient clipping as configured -> 0.3" in decision.reason


def test_a_spent_rung_budget_stops_the_run_for_a_human():
    ladder = (Rung(action=ROLLBACK_SKIP, max_uses=2),)
    config = PolicyConfig(instability=InstabilityConfig(ladder=ladder, repeat_window_steps=0))
    decisions = climb([2000, 4000, 6000], config)
    assert [d.action for d in decisions] == [ROLLBACK_SKIP, ROLLBACK_SKIP, ABORT]
    assert "rollback_skip budget is spent (2 of 2" in decisions[2].reason
    assert "A human must look at the data around step 6000" in decisions[2].reason


def test_no_checkpoint_far_enough_before_a_late_onset_stops_the_run():
    config = PolicyConfig(rollback=RollbackConfig(from_scratch_within_steps=500))
    decision = decide(spike(560), History(), config, CHECKPOINTS)
    assert decision.action == ABORT
    assert "no verified checkpoint at or before step 460" in decision.reason
    assert "too late to start again from initialisation" in decision.reason


def test_an_early_divergence_with_no_checkpoint_before_it_starts_again_from_initialisation():
    """A young run (a too-high LR diverging at step 22, checkpoints every 20): starting
    again from the initial weights costs 22 steps; stopping for a human costs hours."""
    decision = decide(spike(22), History(), PolicyConfig(), (VerifiedCheckpoint(20, 20 * BATCH),))
    assert decision.action == ROLLBACK_SKIP and decision.restarts
    assert decision.restart_from_step is None  # from initialisation
    assert "restart from initialisation (no verified checkpoint at or before step -78; onset 22" in decision.reason
    # The window around the onset is still skipped, from the start of the stream at the earliest.
    assert decision.skip_ranges == (SkipRange(0, (21 + 200) * BATCH),)


def test_starting_again_from_initialisation_can_be_turned_off():
    config = PolicyConfig(rollback=RollbackConfig(from_scratch_within_steps=0))
    assert decide(spike(22), History(), config, ()).action == ABORT


def test_nan_climbs_the_same_ladder_and_recovered_is_never_assumed():
    decision = decide(spike(3050, kind=NONFINITE), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == ROLLBACK_SKIP


def test_later_incidents_of_a_subrun_already_ending_are_only_recorded():
    config, history = PolicyConfig(), History()
    first = spike(3050)
    history = history.record(first, decide(first, history, config, CHECKPOINTS), CHECKPOINTS)
    echo = dataclasses.replace(spike(3051), kind="grad_spike")
    decision = decide(echo, history, config, CHECKPOINTS)
    assert decision.action == IGNORE and "sub-run 12.00 is already ending (rollback_skip" in decision.reason


def test_kinds_left_out_of_the_ladder_are_only_recorded():
    config = PolicyConfig(instability=InstabilityConfig(kinds=(LOSS_SPIKE, NONFINITE)))
    decision = decide(dataclasses.replace(spike(3050), kind="grad_spike"), History(), config, CHECKPOINTS)
    assert decision.action == IGNORE


def test_a_rollback_asks_for_local_norms_on_the_reruns_first_steps():
    decision = decide(spike(3050), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.local_norms_steps == tuple(range(2501, 2551))  # the re-run from 2500, 50 steps
    assert "local norms on steps 2501-2550" in decision.reason
    config = PolicyConfig(rollback=RollbackConfig(local_norms_after_steps=0))
    assert decide(spike(3050), History(), config, CHECKPOINTS).local_norms_steps == ()


def test_a_trainer_without_local_norms_is_asked_for_none():
    from runmgr.config.megatron import MegatronFlavor
    from runmgr.megatron.flavors import abilities_of

    decision = decide(spike(3050), History(), PolicyConfig(), CHECKPOINTS, None, abilities_of(MegatronFlavor.megatron_lm))
    assert decision.restarts and decision.local_norms_steps == () and "local norms" not in decision.reason


NO_LR = dataclasses.replace(BUILTIN_ABILITIES, name="Megatron-LM", lower_lr=False,
                            lower_lr_why_not="the job's arguments give no --lr to scale")


def test_a_rung_that_lowers_the_lr_is_passed_over_for_a_job_that_cannot_and_the_reason_says_why():
    history, decisions = History(), []
    for number, onset in enumerate((2000, 2100)):
        incident = spike(onset, subrun=f"12.{number:02d}")
        decisions.append(decide(incident, history, PolicyConfig(), CHECKPOINTS, abilities=NO_LR))
        history = history.record(incident, decisions[-1], CHECKPOINTS)
    assert [d.action for d in decisions] == [ROLLBACK_SKIP, RESET_OPTIMIZER]
    assert decisions[1].lr_factor == 1.0
    assert "rung 2 (lower_lr, LR x 0.67) passed over: the job's arguments give no --lr to scale" in decisions[1].reason


def test_with_no_rung_left_that_the_job_can_carry_a_person_is_needed():
    only_cuts = PolicyConfig(instability=InstabilityConfig(ladder=(
        Rung(action="lower_lr", max_uses=5, skip_data=True, lr_factor=0.5),)))
    decision = decide(spike(2000), History(), only_cuts, CHECKPOINTS, abilities=NO_LR)
    assert decision.action == ABORT and "passed over" in decision.reason and "no rung after it" in decision.reason
