"""Watcher thresholds: the YAML mirrors the dataclasses; bad values say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from runmgr.errors import ConfigError
from runmgr.config.watcher import WatcherConfig, WatcherConfigError, watcher_config_from_dict

YAML = Path(__file__).parents[3] / "conf" / "watcher" / "default.yaml"


def test_conf_watcher_default_yaml_equals_the_dataclass_defaults():
    loaded = OmegaConf.load(YAML)
    assert watcher_config_from_dict(OmegaConf.to_container(loaded)) == WatcherConfig()
    assert watcher_config_from_dict(loaded) == WatcherConfig()  # a DictConfig as Hydra hands it over


def test_overrides_are_typed():
    config = watcher_config_from_dict({"loss_spike": {"grace_steps": 20, "z_threshold": 5}, "hang": {
        "step": {"initial_s": 30, "min_s": 5, "max_s": 60}}})
    assert config.loss_spike.grace_steps == 20 and config.loss_spike.z_threshold == 5.0
    assert config.hang.step.min_s == 5.0 and config.grad_spike == WatcherConfig().grad_spike


@pytest.mark.parametrize("data,message", [
    ({"loss_spike": {"grace": 10}}, "watcher.loss_spike: unknown key 'grace'"),
    ({"loss_spike": {"grace_steps": "ten"}}, "watcher.loss_spike.grace_steps: expected a whole number"),
    ({"loss_spike": {"z_threshold": 2.0}}, "z_threshold (2.0) must exceed recovery_z"),
    ({"hang": {"step": {"initial_s": 5, "min_s": 10, "max_s": 60}}}, "need 0 < min_s <= initial_s <= max_s"),
    ({"loss_scale": {"max_overflow_share": 1.5}}, "0 < max_overflow_share < 1"),
    ({"devices": {"fatal_event_codes": "79"}}, "watcher.devices.fatal_event_codes: expected a list"),
])
def test_bad_values_raise_one_line_naming_the_key(data, message):
    with pytest.raises(WatcherConfigError) as raised:
        watcher_config_from_dict(data)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert isinstance(raised.value, ConfigError)  # the CLI maps it to exit 2
