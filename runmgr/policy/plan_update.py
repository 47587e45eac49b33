"""Fold a decision into the next sub-run's resume plan (plain data in, plain data out)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trainer.plan import ResumePlan, SkipRange

from runmgr.policy.decision import Decision


def next_plan(plan: ResumePlan, decision: Decision, subrun: str, start_checkpoint: Optional[str],
              also_avoid: tuple[str, ...] = (), also_resize: Optional[int] = None) -> ResumePlan:
    """The plan of the sub-run that ``decision`` starts.

    ``start_checkpoint`` is the directory of the checkpoint the decision names
    (the controller knows the paths). Skip ranges accumulate, the LR scale
    multiplies, a clipping override stays for the rest of the run, and so do
    the nodes to avoid and the steps whose local norms are asked for; an optimizer reset and its re-warmup apply to this
    restart only. ``also_avoid`` and ``also_resize`` come from other decisions
    of the same poll (an ECC error read in the poll whose spike ends the
    sub-run): their nodes stay out, and the smallest size asked for wins.
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
        avoid_nodes=tuple(dict.fromkeys((*plan.avoid_nodes, *decision.exclude_nodes, *also_avoid))),
        local_norms_steps=tuple(sorted({*plan.local_norms_steps, *decision.local_norms_steps})),
        data_parallel_size=_smallest(plan.data_parallel_size, decision.data_parallel_size, also_resize),
    )


def _smallest(current: Optional[int], *asked: Optional[int]) -> Optional[int]:
    """The smallest size the decisions asked for, else the current one."""
    sizes = [size for size in asked if size is not None]
    return min(sizes) if sizes else current


def merge_ranges(ranges: tuple[SkipRange, ...]) -> tuple[SkipRange, ...]:
    """Sorted, with overlapping or touching ranges joined."""
    merged: list[SkipRange] = []
    for current in sorted(ranges, key=lambda r: (r.start, r.end)):
        if merged and current.start <= merged[-1].end:
            merged[-1] = SkipRange(merged[-1].start, max(merged[-1].end, current.end))
        else:
            merged.append(current)
    return tuple(merged)
