"""What each Megatron flavor can carry out of runmgr's remedies (read in their source:
../shared/MEGATRON.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from runmgr.config.argv import flag_value
from runmgr.config.megatron import MegatronFlavor
from runmgr.policy.abilities import TrainerAbilities

NO_REWARMUP = ("Megatron restarts its LR schedule with --no-load-optim: a fresh warmup over --lr-warmup-iters "
               "(it has no re-warmup of its own)")
"""Why a Megatron job gets no re-warmup: the optimizer reset already restarts the whole schedule."""

ABILITIES: dict[MegatronFlavor, TrainerAbilities] = {
    MegatronFlavor.megatron_lm: TrainerAbilities(
        name="Megatron-LM", skip_data=True, rewarmup=False, rewarmup_why_not=NO_REWARMUP, local_norms=False),
    MegatronFlavor.mindspeed_llm: TrainerAbilities(
        name="MindSpeed-LLM", skip_data=False,
        skip_data_why_not="MindSpeed-LLM parses --iterations-to-skip but its training loop never reads it",
        rewarmup=False, rewarmup_why_not=NO_REWARMUP, local_norms=False),
}


def abilities_of(flavor: MegatronFlavor) -> TrainerAbilities:
    """The remedies a job of ``flavor`` can carry out, and why not the others."""
    return ABILITIES[MegatronFlavor(flavor)]


NO_LR = "the job's arguments give no --lr to scale (runmgr lowers the LR by rewriting --lr and --min-lr)"
"""Why a job without ``--lr`` cannot have its LR lowered."""


def job_abilities(flavor: MegatronFlavor, args: Sequence[str]) -> TrainerAbilities:
    """The remedies a job of ``flavor`` with arguments ``args`` can carry out: its flavor's,
    less what its arguments leave no flag for (no ``--lr``: no LR cut)."""
    abilities = abilities_of(flavor)
    if flag_value(args, "--lr") is None:
        abilities = replace(abilities, lower_lr=False, lower_lr_why_not=NO_LR)
    return abilities
