"""What each Megatron flavor can carry out of runmgr's remedies (read in their source:
../shared/MEGATRON.md)."""

from __future__ import annotations

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
