"""A resume plan as the flags of a Megatron job (Megatron-LM's semantics, checked
in its source: ../shared/MEGATRON.md).

runmgr owns the flags of its remedies: it removes the user's copies and writes
its own, so a flag is never given twice with two values:

- the start checkpoint: ``--load DIR --ckpt-step N`` (no ``--load`` at all: from
  initialisation; the user's ``--load`` would otherwise load the newest);
- a lower LR: ``--lr``/``--min-lr`` scaled, with ``--override-opt_param-scheduler``
  (Megatron asserts on a changed LR at resume without it);
- a lower clip: ``--clip-grad``;
- an optimizer reset: ``--no-load-optim`` (the LR schedule restarts with it);
- skipped samples: ``--iterations-to-skip`` (1-indexed), merged with the user's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from trainer.plan import ResumePlan, SkipRange

from runmgr.config.argv import flag_value, flag_values, without_flags
from runmgr.config.megatron import MegatronFlavor
from runmgr.errors import PlanRefusedError
from runmgr.megatron.flavors import abilities_of

OVERRIDE_SCHEDULER = "--override-opt_param-scheduler"
_STEP_DIR = re.compile(r"(?:step|iter)_0*(\d+)")


class PlanNotCarried(PlanRefusedError, ValueError):
    """The plan asks for something the flavor cannot do (one line: what, and why)."""


def checkpoint_step(path: Optional[str]) -> Optional[int]:
    """The iteration of a checkpoint directory named ``step_N`` (the built-in trainer's) or
    ``iter_N`` (Megatron's); None for no path or another name."""
    if not path:
        return None
    match = _STEP_DIR.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def script_args(user_args: Sequence[str], plan: ResumePlan, flavor: MegatronFlavor,
                checkpoint_step: Optional[int], data_parallel_size: Optional[int] = None) -> list[str]:
    """The user's arguments with the flags of ``plan`` in place of theirs.

    ``checkpoint_step`` is the iteration of ``plan.start_checkpoint`` (see
    :func:`checkpoint_step`); ``data_parallel_size`` (the job's, fixed by its
    arguments), when given, is checked against the plan's. Raises :class:`PlanNotCarried` for a plan the flavor
    cannot carry out.
    """
    _refuse_what_cannot_be_carried(plan, flavor, data_parallel_size)
    args = list(user_args)
    args = _start(args, plan, checkpoint_step)
    args = _learning_rate(args, plan)
    if plan.clip_grad is not None:
        args = without_flags(args, ["--clip-grad"]) + ["--clip-grad", _number(plan.clip_grad)]
    if plan.reset_optimizer:
        args.append("--no-load-optim")
    return _skips(args, plan.skip_ranges, checkpoint_step)


def _refuse_what_cannot_be_carried(plan: ResumePlan, flavor: MegatronFlavor,
                                   data_parallel_size: Optional[int]) -> None:
    abilities = abilities_of(flavor)
    if plan.skip_ranges and not abilities.skip_data:
        raise PlanNotCarried(f"the plan of sub-run {plan.subrun} skips samples, but {abilities.skip_data_why_not}")
    if plan.rewarmup_iters:
        raise PlanNotCarried(f"the plan of sub-run {plan.subrun} asks a {plan.rewarmup_iters}-step re-warmup, but "
                             f"{abilities.rewarmup_why_not}")
    if (plan.data_parallel_size is not None and data_parallel_size is not None
            and plan.data_parallel_size != data_parallel_size):
        raise PlanNotCarried(f"the plan of sub-run {plan.subrun} asks for data parallel {plan.data_parallel_size}, "
                             f"but the job runs data parallel {data_parallel_size}")


def _start(args: list[str], plan: ResumePlan, step: Optional[int]) -> list[str]:
    args = without_flags(args, ["--load", "--ckpt-step", "--no-load-optim"])
    if plan.start_checkpoint is None:
        return args
    if step is None:
        raise PlanNotCarried(f"the plan of sub-run {plan.subrun} starts from {plan.start_checkpoint}, whose name "
                             f"tells no iteration (step_N or iter_N) for --ckpt-step")
    return args + ["--load", str(Path(plan.start_checkpoint).parent), "--ckpt-step", str(step)]


def _learning_rate(args: list[str], plan: ResumePlan) -> list[str]:
    if plan.lr_scale == 1.0:
        return args
    lr = flag_value(args, "--lr")
    if lr is None:
        raise PlanNotCarried(f"the plan of sub-run {plan.subrun} scales the LR by {plan.lr_scale:g}, but the job's "
                             f"arguments give no --lr to scale")
    scaled = ["--lr", _number(float(lr) * plan.lr_scale)]
    min_lr = flag_value(args, "--min-lr")
    if min_lr is not None:
        scaled += ["--min-lr", _number(float(min_lr) * plan.lr_scale)]
    return without_flags(args, ["--lr", "--min-lr", OVERRIDE_SCHEDULER]) + scaled + [OVERRIDE_SCHEDULER]


def iterations_to_skip(ranges: Sequence[SkipRange], global_batch: int, after: int = 0,
                       until: Optional[int] = None) -> list[int]:
    """The 1-indexed iterations whose batches hold the samples of ``ranges``: iteration J
    trains on stream positions [(J-1)*B, J*B), so [a, b) is iterations a//B+1 .. ceil(b/B).
    Iterations at or before ``after`` (already trained past by the start checkpoint) are left out,
    and past ``until`` (the job's ``--train-iters``: it never runs them), so that a window drawn
    from a number the job printed, however wide, is never more iterations than the run has."""
    found: set[int] = set()
    for skip in ranges:
        first = max(skip.start // global_batch + 1, after + 1)
        last = -(-skip.end // global_batch)  # ceil, exact for any whole number
        if until is not None:
            last = min(last, until)
        found.update(range(first, last + 1))
    return sorted(found)


def _skips(args: list[str], ranges: Sequence[SkipRange], step: Optional[int]) -> list[str]:
    if not ranges:
        return args
    batch = flag_value(args, "--global-batch-size")
    if batch is None or not batch.isdigit() or int(batch) <= 0:
        raise PlanNotCarried("skipped samples need the job's --global-batch-size to find their iterations")
    train_iters = flag_value(args, "--train-iters")
    until = int(train_iters) if train_iters is not None and train_iters.isdigit() else None
    ours = iterations_to_skip(ranges, int(batch), after=step or 0, until=until)
    theirs = [int(value) for value in flag_values(args, "--iterations-to-skip") or ()]
    merged = sorted(set(ours) | set(theirs))
    if not merged:
        return args
    return without_flags(args, ["--iterations-to-skip"]) + ["--iterations-to-skip", *map(str, merged)]


def _number(value: float) -> str:
    """A float as Megatron's argparse reads it back exactly."""
    return repr(float(value))
