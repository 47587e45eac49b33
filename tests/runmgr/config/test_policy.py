"""Policy settings: the YAML mirrors the dataclasses; bad rungs say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from runmgr.errors import ConfigError
from runmgr.config.policy import PolicyConfig, PolicyConfigError, policy_config_from_dict

YAML = Path(__file__).parents[3] / "conf" / "policy" / "default.yaml"


def test_conf_policy_default_yaml_equals_the_dataclass_defaults():
    assert policy_config_from_dict(OmegaConf.to_container(OmegaConf.load(YAML))) == PolicyConfig()
    assert policy_config_from_dict(OmegaConf.load(YAML)) == PolicyConfig()  # a DictConfig as Hydra hands it


def test_a_custom_ladder_is_typed():
    config = policy_config_from_dict({"instability": {"ladder": [
        {"action": "lower_clip", "clip_grad": 0.3}, {"action": "reset_optimizer", "rewarmup_iters": 2000}]}})
    assert [r.action for r in config.instability.ladder] == ["lower_clip", "reset_optimizer"]
    assert config.instability.ladder[1].rewarmup_iters == 2000


DEFAULT_DEATH_ACTIONS = {str(category): str(action) for category, action in PolicyConfig().death_actions.items()}


@pytest.mark.parametrize("data,message", [
    ({"instability": {"ladder": [{"action": "pray"}]}}, "ladder[0].action: 'pray' is not one of rollback_skip, lower_lr"),
    ({"instability": {"ladder": [{"action": "lower_lr", "lr_factor": 1.0}]}}, "needs lr_factor < 1"),
    ({"instability": {"ladder": [{"action": "lower_clip"}]}}, "needs clip_grad > 0"),
    ({"instability": {"ladder": []}}, "at least one rung"),
    ({"instability": {"kinds": ["hang"]}}, "kinds[0]: 'hang' is not one of loss_spike"),
    ({"death_actions": {"bug": "restart"}}, "missing hardware"),
    ({"slowdown_action": "panic"}, "slowdown_action: 'panic' is not one of ignore, restart"),
    ({"death_actions": {"gremlins": "restart"}}, "death_actions.gremlins: 'gremlins' is not one of hardware"),
    ({"death_actions": {"bug": "pray"}}, "death_actions.bug: 'pray' is not one of exclude_node, restart, abort"),
    ({"death_actions": {**DEFAULT_DEATH_ACTIONS, "io": "reject_checkpoint"}},
     "death_actions.io: reject_checkpoint is only for the checkpoint category"),
    ({"restarts": {"launch_retry_wait_s": float("nan")}}, "launch_retry_wait_s must be a finite number"),
    ({"rollback": {"margin": 5}}, "policy.rollback: unknown key 'margin'"),
    ({"restarts": {"max_restarts": 2.5}}, "policy.restarts.max_restarts: expected a whole number"),
])
def test_bad_settings_raise_one_line(data, message):
    with pytest.raises(PolicyConfigError) as raised:
        policy_config_from_dict(data)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert isinstance(raised.value, ConfigError)
