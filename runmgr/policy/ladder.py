"""The policy: incident + history + budgets -> decision. Pure.

:func:`decide` routes each incident kind to its rule; this module holds the
instability ladder (a recovered spike is recorded; a persistent one rolls back
and skips data; again soon after, the LR goes down for good; still again,
Adam's moments are reset with a fresh warmup; past the budgets, a human).
The fault rules (hangs, deaths, devices, stragglers) live in
:mod:`runmgr.policy.faults`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional
from trainer.plan import SkipRange

from runmgr.policy.abilities import BUILTIN_ABILITIES, TrainerAbilities
from runmgr.policy.capacity import Capacity
from runmgr.policy.checkpoints import VerifiedCheckpoint, newest_at_or_before
from runmgr.config.policy import PolicyConfig, Rung
from runmgr.policy.decision import ABORT, IGNORE, RESET_OPTIMIZER, Decision
from runmgr.policy.faults import decide_fault
from runmgr.policy.guards import storm_abort
from runmgr.policy.history import History
from runmgr.policy.storage import decide_storage_outage
from runmgr.policy.warm import WarmCover
from runmgr.watch.incidents import DEVICE_FAULT, INSTABILITY_KINDS, STORAGE_OUTAGE, Incident


REWARMUP_SHARE = 10
"""A re-warmup takes at most a tenth of the steps left after the restart: OPT's 200 steps of a
150,000-step run, not the last half of a short one."""


def decide(incident: Incident, history: History, config: PolicyConfig,
           checkpoints: Sequence[VerifiedCheckpoint], capacity: Optional[Capacity] = None,
           abilities: TrainerAbilities = BUILTIN_ABILITIES, warm: Optional[WarmCover] = None,
           final_step: Optional[int] = None) -> Decision:
    """The decision for ``incident``. ``checkpoints`` are the verified ones, any order;
    ``capacity`` what the cluster can hold now (None: unknown, keep the data-parallel size);
    ``abilities`` the remedies the trainer in use can carry out (a rung asks no more);
    ``warm`` what the worker group could recover warm now (None: nothing, every restart is cold);
    ``final_step`` the run's last step (None: unknown), which sizes a re-warmup."""
    if incident.kind == STORAGE_OUTAGE:  # the driver's uploads, whatever the sub-run is doing
        return decide_storage_outage(incident)
    closing = history.closing_entry(incident.subrun)
    if closing is not None and incident.kind != DEVICE_FAULT:
        return Decision(IGNORE, (
            f"recorded: sub-run {incident.subrun} is already ending ({closing.decision.action} for "
            f"{closing.incident.kind} from step {closing.incident.onset_step})"))
    if incident.kind in INSTABILITY_KINDS:
        if incident.recovered:
            return Decision(IGNORE, f"recorded, training goes on: {_recovery(incident)}")
        if incident.kind not in config.instability.kinds:
            return Decision(IGNORE, f"recorded: {incident.kind} is not in policy.instability.kinds")
        return _climb(incident, history, config, checkpoints, abilities, final_step)
    return decide_fault(incident, history, config, checkpoints, capacity, warm)


def _climb(incident: Incident, history: History, config: PolicyConfig,
           checkpoints: Sequence[VerifiedCheckpoint], abilities: TrainerAbilities,
           final_step: Optional[int] = None) -> Decision:
    onset = incident.onset_step if incident.onset_step is not None else 0
    ladder = config.instability.ladder
    chain = history.instability_streak(onset, config.instability.repeat_window_steps)
    level = len(chain) + 1
    earlier = ", ".join(str(e.incident.onset_step) for e in reversed(chain)) or "none"
    grace = incident.evidence.get("grace_steps")
    persisted = f" did not recover within {grace} steps and" if grace is not None else ""
    why = (f"{incident.kind} from step {onset}{persisted} is instability {level} in a row (earlier onsets "
           f"within {config.instability.repeat_window_steps} steps: {earlier})")
    index, passed = _carried_rung(ladder, min(level, len(ladder)) - 1, abilities)
    if passed:
        why += f"; {'; '.join(passed)}"
    if index is None:
        return Decision(ABORT, (
            f"{why}, and no rung after it. A human must look at the data around step {onset} and the "
            f"optimizer settings, or give the job what the rung needs"))
    rung = ladder[index]
    used = history.uses(rung.action)
    if used >= rung.max_uses:
        return Decision(ABORT, (
            f"{why}; the {rung.action} budget is spent ({used} of {rung.max_uses}, LR scale now "
            f"{history.lr_scale():.3g}). A human must look at the data around step {onset} and the "
            f"optimizer settings (beta2, eps, LR, clipping, weight decay)"))
    target = onset - config.rollback.margin_steps
    start = newest_at_or_before(checkpoints, target)
    if start is None and onset > config.rollback.from_scratch_within_steps:
        steps = sorted(c.step for c in checkpoints)
        return Decision(ABORT, (
            f"{why}; no verified checkpoint at or before step {target} (onset {onset} - margin "
            f"{config.rollback.margin_steps}); verified: {steps or 'none'}; the onset is past step "
            f"{config.rollback.from_scratch_within_steps}, too late to start again from initialisation. A human "
            f"must choose where to restart, or lower policy.rollback.margin_steps"))
    storm = storm_abort(incident, history, config, checkpoints)
    if storm is not None:
        return storm
    return _rung_decision(incident, history, config, rung, start, why, used, abilities, final_step)


def _carried_rung(ladder: Sequence[Rung], index: int,
                  abilities: TrainerAbilities) -> tuple[Optional[int], list[str]]:
    """The first rung from ``index`` on that the trainer can carry out (None: none is), and a
    note for each rung passed over (a rung that lowers the LR, for a job that cannot)."""
    passed = []
    for at in range(index, len(ladder)):
        rung = ladder[at]
        if rung.lr_factor == 1.0 or abilities.lower_lr:
            return at, passed
        passed.append(f"rung {at + 1} ({rung.action}, LR x {rung.lr_factor:g}) passed over: "
                      f"{abilities.lower_lr_why_not}")
    return None, passed


def _recovery(incident: Incident) -> str:
    evidence = incident.evidence
    if "resolved_step" not in evidence or incident.onset_step is None:
        return f"the {incident.kind} went away by itself"
    return (f"the {incident.kind} recovered by itself {evidence['resolved_step'] - incident.onset_step} steps "
            f"after its onset at step {incident.onset_step}, within the {evidence['grace_steps']}-step grace "
            f"window (peak {evidence['peak_rise']:+.0%} over the baseline at step {incident.peak_step})")


def _rung_decision(incident: Incident, history: History, config: PolicyConfig, rung: Rung,
                   start: Optional[VerifiedCheckpoint], why: str, used: int,
                   abilities: TrainerAbilities = BUILTIN_ABILITIES, final_step: Optional[int] = None) -> Decision:
    """``start`` None: no verified checkpoint is old enough, and the run is young
    enough to start again from initialisation. What the trainer cannot carry out (a
    skip, a re-warmup) is left out of the decision, and its reason says why."""
    onset = incident.onset_step if incident.onset_step is not None else 0
    origin = start or VerifiedCheckpoint(0, 0)
    if not rung.skip_data:
        skips, skip_note = (), "no data skipped"
    elif not abilities.skip_data:
        skips, skip_note = (), f"no data skipped: {abilities.skip_data_why_not}"
    else:
        skips, skip_note = _skip_window(incident, config, origin)
    rewarmup, sized = _rewarmup_steps(rung.rewarmup_iters, origin.step, final_step)
    rewarmup = rewarmup if abilities.rewarmup else 0
    if start is None:
        restart = (f"restart from initialisation (no verified checkpoint at or before step "
                   f"{onset - config.rollback.margin_steps}; onset {onset} is within "
                   f"{config.rollback.from_scratch_within_steps} steps of the start)")
    else:
        restart = (f"restart from verified checkpoint {start.step} ({onset - start.step} steps before onset, "
                   f"margin {config.rollback.margin_steps})")
    changes = [restart, skip_note]
    if rung.lr_factor != 1.0:
        before = history.lr_scale()
        changes.append(f"LR scale {before:.3g} -> {before * rung.lr_factor:.3g} for the rest of the run")
    if rung.clip_grad is not None:
        changes.append(f"gradient clipping {history.clip_grad() or 'as configured'} -> {rung.clip_grad:g} "
                       f"for the rest of the run")
    changes += _rewarmup_notes(rung, abilities, rewarmup, sized)
    norms_steps = _local_norms_steps(origin.step, config, abilities)
    if norms_steps:
        changes.append(f"local norms on steps {norms_steps[0]}-{norms_steps[-1]}")
    return Decision(
        rung.action,
        f"{why} -> {rung.action} (use {used + 1} of {rung.max_uses}): {'; '.join(changes)}",
        restart_from_step=start.step if start else None, skip_ranges=skips, lr_factor=rung.lr_factor,
        clip_grad=rung.clip_grad,
        reset_optimizer=rung.action == RESET_OPTIMIZER, rewarmup_iters=rewarmup, local_norms_steps=norms_steps,
    )


def _local_norms_steps(start_step: int, config: PolicyConfig, abilities: TrainerAbilities) -> tuple[int, ...]:
    """The re-run's first ``policy.rollback.local_norms_after_steps`` steps, when the trainer
    reports local norms (a Megatron job has none: docs/local_norms.md)."""
    if not abilities.local_norms:
        return ()
    return tuple(range(start_step + 1, start_step + 1 + config.rollback.local_norms_after_steps))


def _rewarmup_steps(asked: int, restart_step: int, final_step: Optional[int]) -> tuple[int, str]:
    """The re-warmup's length: the rung's, at most :data:`REWARMUP_SHARE`'s share of the steps left
    after the restart (at least one step when any is asked), and why when it was cut."""
    if not asked or final_step is None:
        return asked, ""
    left = max(0, final_step - restart_step)
    cap = max(1, left // REWARMUP_SHARE)
    if asked <= cap:
        return asked, ""
    return cap, f" (the rung's {asked}, cut to a tenth of the {left} steps left after the restart)"


def _rewarmup_notes(rung: Rung, abilities: TrainerAbilities, steps: int, sized: str) -> list[str]:
    """The reset and re-warmup a rung asks for, as the trainer in use carries them out."""
    reset = rung.action == RESET_OPTIMIZER
    if abilities.rewarmup or not (reset or rung.rewarmup_iters):
        if reset:
            return [f"reset Adam's moments, keep the weights, re-warm up over {steps} steps{sized}"]
        return [f"re-warm up over {steps} steps{sized}"] if rung.rewarmup_iters else []
    dropped = f"no re-warmup of {rung.rewarmup_iters} steps" if rung.rewarmup_iters else "no re-warmup"
    if reset:
        return [f"reset Adam's moments, keep the weights; {dropped}: {abilities.rewarmup_why_not}"]
    return [f"{dropped}: {abilities.rewarmup_why_not}"]


def _skip_window(incident: Incident, config: PolicyConfig,
                 start: VerifiedCheckpoint) -> tuple[tuple[SkipRange, ...], str]:
    """Samples from ``skip_before_steps`` before the onset to ``skip_after_steps`` after it,
    never before the restart checkpoint's position (those were trained on before the trouble)."""
    per_step = incident.samples_per_step
    if incident.onset_sample is None or not per_step:
        return (), "no data skipped: the observations carry no sample positions"
    cfg = config.rollback
    first = max(incident.onset_sample - cfg.skip_before_steps * per_step, start.consumed_samples or 0, 0)
    last = incident.onset_sample + cfg.skip_after_steps * per_step
    if last <= first:
        return (), "no data skipped: the window is empty"
    note = (f"skip samples [{first}, {last}) = {(last - first) // per_step} steps of {per_step} samples "
            f"({cfg.skip_before_steps} before to {cfg.skip_after_steps} after the onset at sample "
            f"{incident.onset_sample})")
    return (SkipRange(first, last),), note
