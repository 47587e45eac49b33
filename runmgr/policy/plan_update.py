"""Fold a decision into the next sub-run's resume plan (plain data in, plain data out)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trainer.plan import ResumePlan, SkipRange

from runmgr.policy.decision import Decision


def next_plan(plan: ResumePlan, decision: Decision, subrun: str, start_checkpoint: Optional[str]) -> ResumePlan:
    """The plan of the sub-run that ``decision`` starts.

    ``start_checkpoint`` is the directory of the checkpoint at
    ``decision.restart_from_step`` (the controller knows the paths). Skip
    ranges accumulate, the LR scale multiplies and a clipping override stays
    for the rest of the run; an optimizer reset and its re-warmup apply to
    this restart only.
    """
    if not decision.restarts:
        raise ValueError(f"decision {decision.action!r} does not start a sub-run")
    return replace(
        plan,
        subrun=subrun,
        start_checkpoint=start_checkpoint,
        skip_ranges=merge_ranges(plan.skip_ranges + decision.skip_ranges),
        lr_scale=plan.lr_scale * decision.lr_factor,
        clip_grad=decision.clip_grad if decision.clip_grad is not None else plan.clip_grad,
        reset_optimizer=decision.reset_optimizer,
        rewarmup_iters=decision.rewarmup_iters,
    )


def merge_ranges(ranges: tuple[SkipRange, ...]) -> tuple[SkipRange, ...]:
    """Sorted, with overlapping or touching ranges joined."""
    merged: list[SkipRange] = []
    for current in sorted(ranges, key=lambda r: (r.start, r.end)):
        if merged and current.start <= merged[-1].end:
            merged[-1] = SkipRange(merged[-1].start, max(merged[-1].end, current.end))
        else:
            merged.append(current)
    return tuple(merged)
