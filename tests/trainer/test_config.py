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


def test_tensor_parallel_within_pipeline_stages_is_executable():
    config = TrainerConfig(model=ModelConfig(untie_embeddings_and_output_weights=True),
                           parallel=ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2))
    assert config.unsupported() is None and config.problems(4) == []


def test_a_data_parallel_config_is_executable():
    assert TrainerConfig().unsupported() is None


def test_tensor_parallel_runs_when_it_divides_heads_groups_ffn_and_vocab():
    config = TrainerConfig(parallel=ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True))
    assert config.unsupported() is None and config.problems(4) == []


@pytest.mark.parametrize("model, tp, sequence, named", [
    ({"num_attention_heads": 16}, 3, False, "parallel.tensor_model_parallel_size (3) must divide model.num_attention_heads (16)"),
    ({"num_query_groups": 2}, 4, False, "must divide model.num_query_groups (2)"),
    ({"ffn_hidden_size": 770}, 4, False, "must divide model.ffn_hidden_size (770)"),
    ({"vocab_size": 50257}, 2, False, "must divide model.vocab_size (50257)"),
    ({"seq_length": 510}, 4, True, "must divide model.seq_length (510)"),
])
def test_a_tensor_parallel_size_that_does_not_split_the_model_evenly_is_refused(model, tp, sequence, named):
    defaults = ModelConfig(num_attention_heads=12, hidden_size=768, ffn_hidden_size=3072, vocab_size=50304,
                           seq_length=512, max_position_embeddings=512)
    config = TrainerConfig(model=dataclasses.replace(defaults, **model),
                           parallel=ParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=sequence))
    problems = config.problems(tp)
    assert any(named in line and "\n" not in line for line in problems), problems


def test_sequence_parallel_without_tensor_parallel_is_refused():
    problems = TrainerConfig(parallel=ParallelConfig(sequence_parallel=True)).problems(1)
    assert problems == ["parallel.sequence_parallel=true needs parallel.tensor_model_parallel_size > 1 (it splits "
                        "the sequence over the tensor-parallel ranks); set parallel.sequence_parallel=false"]


def test_a_bf16_embedding_under_tensor_parallel_is_refused_in_one_line():
    config = TrainerConfig(parallel=ParallelConfig(tensor_model_parallel_size=2),
                           precision=dataclasses.replace(TrainerConfig().precision, embedding_bf16=True))
    assert "set precision.embedding_bf16=false" in config.unsupported()


@pytest.mark.parametrize("parallel", [ParallelConfig(use_distributed_optimizer=True), ParallelConfig(use_torch_fsdp2=True)])
def test_sharded_data_parallel_is_executable(parallel):
    assert TrainerConfig(parallel=parallel).unsupported() is None and TrainerConfig(parallel=parallel).problems(1) == []


def test_the_distributed_optimizer_with_tensor_parallel_is_refused_in_one_line():
    config = TrainerConfig(parallel=ParallelConfig(use_distributed_optimizer=True, tensor_model_parallel_size=2))
    line = config.unsupported()
    assert config.problems(4) == [] and "\n" not in line and "parallel.use_distributed_optimizer=true" in line and "set parallel.use_distributed_optimizer=false" in line


def test_keep_last_zero_keeps_every_checkpoint_and_a_negative_one_is_refused():
    keep_all = TrainerConfig(checkpoint=dataclasses.replace(TrainerConfig().checkpoint, keep_last=0))
    assert keep_all.problems(1) == []
    negative = TrainerConfig(checkpoint=dataclasses.replace(TrainerConfig().checkpoint, keep_last=-1))
    assert negative.problems(1) == ["checkpoint.keep_last must be >= 0 (0 keeps every checkpoint), got -1"]


@pytest.mark.parametrize("key", ["use_distributed_optimizer", "use_torch_fsdp2"])
def test_sharding_within_pipeline_stages_is_refused_in_one_line(key):
    config = TrainerConfig(parallel=ParallelConfig(pipeline_model_parallel_size=2, **{key: True}))
    line = config.unsupported()
    assert line is not None and f"set parallel.{key}=false" in line and "\n" not in line
