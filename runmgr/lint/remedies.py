"""The rule that reads the policy beside the job: a remedy the job's own arguments
cannot carry is told at launch, before the ladder needs it.

runmgr lowers a Megatron job's LR by rewriting its ``--lr`` (and ``--min-lr``);
a job that gives no ``--lr`` (its script's default, or a config file of its
own) leaves nothing to scale. Forced with ``lint.ignore=[remedy-lr-cut]``, the
policy passes such a rung over and says so (runmgr/policy/ladder.py).
"""

from __future__ import annotations

from typing import Optional

from runmgr.config.schema import RunConfig
from runmgr.lint.findings import Finding
from runmgr.lint.rules import RULES
from runmgr.megatron.flavors import job_abilities
from runmgr.megatron.job import effective_args


def remedy_lr_cut(config: RunConfig) -> Optional[Finding]:
    """An error when the ladder lowers the LR and the Megatron job cannot have it lowered."""
    if not config.drives_megatron:
        return None
    abilities = job_abilities(config.megatron.flavor, effective_args(config))
    cuts = [f"{index + 1} ({rung.action}, LR x {rung.lr_factor:g})"
            for index, rung in enumerate(config.policy.instability.ladder) if rung.lr_factor != 1.0]
    if abilities.lower_lr or not cuts:
        return None
    return RULES["remedy-lr-cut"].finding(
        f"policy.instability.ladder rung {', '.join(cuts)} lowers the LR, but {abilities.lower_lr_why_not}",
        "add --lr (and --min-lr) to megatron.args, or give those rungs lr_factor: 1.0; with "
        "lint.ignore=[remedy-lr-cut] the policy passes them over")


def check_remedies(config: RunConfig) -> list[Finding]:
    """Every remedy the job cannot carry."""
    found = remedy_lr_cut(config)
    return [found] if found is not None else []
