"""What the trainer in use can carry out: the policy chooses only those remedies.

The built-in trainer does everything the ladder knows. A Megatron flavor may
not skip data (MindSpeed-LLM parses ``--iterations-to-skip`` but never reads
it) or re-warm up (Megatron's optimizer reset restarts the whole schedule);
runmgr/megatron/flavors.py says which, and why, for each flavor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerAbilities:
    """Which remedies the trainer in use can carry out; the policy chooses only those."""

    name: str = "the built-in trainer"
    """The trainer, as a reason names it."""
    skip_data: bool = True
    """It can leave sample ranges out of the stream after a rollback."""
    skip_data_why_not: str = ""
    """Why not, for the decision's reason (empty when it can)."""
    rewarmup: bool = True
    """A linear re-warmup to the scheduled LR after a restart."""
    rewarmup_why_not: str = ""
    """Why not, for the decision's reason (empty when it can)."""
    local_norms: bool = True
    """It reports per-weight gradient norms on the steps a plan asks for."""
    lower_lr: bool = True
    """It can run the rest of the run at a lower LR (a rung's ``lr_factor``)."""
    lower_lr_why_not: str = ""
    """Why not, for the decision's reason (empty when it can)."""


BUILTIN_ABILITIES = TrainerAbilities()
