"""The trainer's config: its sections are listed once, its choices are typed
(a wrong value is one line naming the choices, YAML keeps plain strings), and
what the built-in trainer cannot execute is named up front."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer.checkpoint import config_hash
from trainer.cli import split_overrides, trainer_config
from trainer.config import (
    TRAINER_SECTIONS,
    DeviceKind,
    LrDecayStyle,
    ModelConfig,
    ModelFamily,
    OptimConfig,
    ParallelConfig,
    TrainerConfig,
)
from trainer.errors import TrainerConfigError

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_the_sections_are_the_fields_of_trainer_config():
    assert TRAINER_SECTIONS == tuple(f.name for f in dataclasses.fields(TrainerConfig))
    assert {"model", "optim", "parallel", "checkpoint", "device"} <= set(TRAINER_SECTIONS)


@pytest.mark.parametrize("section", TRAINER_SECTIONS)
def test_the_cli_types_a_key_of_every_section_against_the_schema(section):
    _, to_schema = split_overrides([f"{section}.x=1" if section != "device" else "device=cpu"], CONF)
    assert len(to_schema) == 1


@pytest.mark.parametrize("key, value, choices", [
    ("device", "gpu", "[auto, cpu, cuda, npu]"),
    ("model.family", "gpt", "[llama, opt]"),
    ("model.recompute_granularity", "selective", "[full]"),
    ("optim.lr_decay_style", "cos", "[cosine, linear, constant]"),
])
def test_a_value_outside_a_choice_is_one_line_naming_the_choices(key, value, choices):
    with pytest.raises(TrainerConfigError) as caught:
        trainer_config(OmegaConf.create({}), [f"{key}={value}"])
    message = str(caught.value)
    assert key in message and repr(value) in message and choices in message and "\n" not in message


def test_choices_read_from_yaml_strings_and_behave_as_those_strings():
    config = trainer_config(OmegaConf.create({"model": {"family": "opt", "recompute_granularity": "full"},
                                              "optim": {"lr_decay_style": "linear"}, "device": "cpu"}))
    assert config.model.family is ModelFamily.opt and config.optim.lr_decay_style is LrDecayStyle.linear
    assert config.device == "cpu" and f"{config.device}" == "cpu" and str(config.model.family) == "opt"
    assert config.model.recompute_granularity == "full"


def test_typed_choices_leave_the_config_hash_of_existing_checkpoints_unchanged():
    as_strings = TrainerConfig(model=ModelConfig(family="opt"), optim=OptimConfig(lr_decay_style="linear"),
                               device="cpu")
    typed = TrainerConfig(model=ModelConfig(family=ModelFamily.opt), optim=OptimConfig(lr_decay_style=LrDecayStyle.linear),
                          device=DeviceKind.cpu)
    assert config_hash(typed) == config_hash(as_strings)


@pytest.mark.parametrize("parallel, named", [
    (ParallelConfig(tensor_model_parallel_size=2), "parallel.tensor_model_parallel_size=2"),
    (ParallelConfig(pipeline_model_parallel_size=4), "parallel.pipeline_model_parallel_size=4"),
])
def test_settings_the_trainer_cannot_execute_are_named_with_their_fix(parallel, named):
    config = TrainerConfig(parallel=parallel)
    unsupported = config.unsupported()
    key = named.split("=")[0]
    assert unsupported is not None and named in unsupported and f"set {key}=" in unsupported
    one_replica = parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size
    assert config.problems(one_replica) == []  # consistent: --dry-run still plans it


def test_a_data_parallel_config_is_executable():
    assert TrainerConfig().unsupported() is None


@pytest.mark.parametrize("parallel", [ParallelConfig(use_distributed_optimizer=True), ParallelConfig(use_torch_fsdp2=True)])
def test_sharded_data_parallel_is_executable(parallel):
    assert TrainerConfig(parallel=parallel).unsupported() is None and TrainerConfig(parallel=parallel).problems(1) == []


def test_the_distributed_optimizer_with_tensor_parallel_is_refused_in_one_line_naming_fsdp2():
    config = TrainerConfig(parallel=ParallelConfig(use_distributed_optimizer=True, tensor_model_parallel_size=2))
    line = config.unsupported()
    assert config.problems(4) == [] and "\n" not in line and "parallel.use_distributed_optimizer=true" in line and "parallel.use_torch_fsdp2=true" in line


def test_keep_last_zero_keeps_every_checkpoint_and_a_negative_one_is_refused():
    keep_all = TrainerConfig(checkpoint=dataclasses.replace(TrainerConfig().checkpoint, keep_last=0))
    assert keep_all.problems(1) == []
    negative = TrainerConfig(checkpoint=dataclasses.replace(TrainerConfig().checkpoint, keep_last=-1))
    assert negative.problems(1) == ["checkpoint.keep_last must be >= 0 (0 keeps every checkpoint), got -1"]
