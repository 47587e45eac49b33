"""The policy chooses only remedies the trainer can carry out, and says why it left one out."""

from __future__ import annotations

from runmgr.config.megatron import MegatronFlavor
from runmgr.config.policy import InstabilityConfig, PolicyConfig, Rung
from runmgr.controller.judge import Judge
from runmgr.config.watcher import WatcherConfig
from runmgr.megatron.flavors import abilities_of
from runmgr.policy.decision import LOWER_LR, RESET_OPTIMIZER, ROLLBACK_SKIP
from runmgr.policy.history import History
from runmgr.policy.ladder import decide

from tests.runmgr.policy.test_ladder import CHECKPOINTS, spike

MINDSPEED = abilities_of(MegatronFlavor.mindspeed_llm)
MEGATRON_LM = abilities_of(MegatronFlavor.megatron_lm)


def ladder(*rungs: Rung) -> PolicyConfig:
    return PolicyConfig(instability=InstabilityConfig(ladder=rungs))


def test_the_built_in_trainer_still_skips_by_default():
    decision = decide(spike(3000), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == ROLLBACK_SKIP and decision.skip_ranges


def test_mindspeed_rolls_back_without_a_skip_and_says_why():
    decision = decide(spike(3000), History(), PolicyConfig(), CHECKPOINTS, abilities=MINDSPEED)
    assert decision.action == ROLLBACK_SKIP and decision.restart_from_step is not None
    assert decision.skip_ranges == ()
    assert ("no data skipped: MindSpeed-LLM parses --iterations-to-skip but its training loop never reads it"
            in decision.reason)


def test_megatron_lm_skips_data():
    assert decide(spike(3000), History(), PolicyConfig(), CHECKPOINTS, abilities=MEGATRON_LM).skip_ranges


def test_an_optimizer_reset_on_megatron_restarts_the_schedule_instead_of_a_rewarmup():
    config = ladder(Rung(action=RESET_OPTIMIZER, skip_data=True, rewarmup_iters=100))
    decision = decide(spike(3000), History(), config, CHECKPOINTS, abilities=MEGATRON_LM)
    assert decision.reset_optimizer and decision.rewarmup_iters == 0
    assert ("no re-warmup of 100 steps: Megatron restarts its LR schedule with --no-load-optim: a fresh warmup "
            "over --lr-warmup-iters") in decision.reason
    builtin = decide(spike(3000), History(), config, CHECKPOINTS)
    assert builtin.rewarmup_iters == 100


def test_a_lower_lr_rewarmup_is_dropped_with_its_reason():
    config = ladder(Rung(action=LOWER_LR, lr_factor=0.5, rewarmup_iters=20))
    decision = decide(spike(3000), History(), config, CHECKPOINTS, abilities=MINDSPEED)
    assert decision.lr_factor == 0.5 and decision.rewarmup_iters == 0 and decision.skip_ranges == ()
    assert "no re-warmup of 20 steps: Megatron restarts its LR schedule" in decision.reason


def test_the_judge_decides_with_the_abilities_it_was_given():
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda step: CHECKPOINTS, abilities=MINDSPEED)
    judgement = judge._decide(spike(3000), 3100)
    assert judgement.decision.action == ROLLBACK_SKIP and judgement.decision.skip_ranges == ()
