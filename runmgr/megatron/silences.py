"""The silences a Megatron sub-run's own command line makes (runmgr/watch/silences.py).

Read from the arguments the sub-run really got: the iterations it skips
(``--iterations-to-skip``, after its start ``--ckpt-step``), its evaluations
(``--eval-interval`` x ``--eval-iters``, Megatron's defaults 1000 and 100 when
not given, ``--eval-iters 0`` for none), its saves (``--save-interval``) and
its last iteration (``--train-iters``). A value that is no whole number counts
as not given: the job's own parser refuses it at its start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from runmgr.config.argv import flag_value, flag_values
from runmgr.watch.silences import PlannedSilences

MEGATRON_EVAL_INTERVAL = 1000
"""Megatron-LM's default ``--eval-interval``."""
MEGATRON_EVAL_ITERS = 100
"""Megatron-LM's default ``--eval-iters``."""


def _whole(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and text.isdigit() else None


def planned_silences(args: Sequence[str], subrun: str, at: float) -> PlannedSilences:
    """Where the sub-run of ``args`` (its script's arguments, or torchrun's whole argv) is silent by plan."""
    start = _whole(flag_value(args, "--ckpt-step")) or 0
    skipped = sorted({n for n in map(_whole, flag_values(args, "--iterations-to-skip") or ()) if n and n > start})
    eval_interval = _whole(flag_value(args, "--eval-interval"))
    eval_iters = _whole(flag_value(args, "--eval-iters"))
    return PlannedSilences(
        subrun=subrun, time=at, skipped=tuple(skipped),
        eval_interval=eval_interval if eval_interval is not None else MEGATRON_EVAL_INTERVAL,
        eval_iters=eval_iters if eval_iters is not None else MEGATRON_EVAL_ITERS,
        save_interval=_whole(flag_value(args, "--save-interval")) or None,
        final_step=_whole(flag_value(args, "--train-iters")),
    )
