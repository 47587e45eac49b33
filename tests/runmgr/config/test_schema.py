"""RunConfig is the trainer's sections plus the driver's: a section added to
TrainerConfig is one edit, and the trainer gets every section back."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from runmgr.config.compose import config_as_dict, load_run_config
from runmgr.config.schema import PlacementStrategy, RunConfig
from runmgr.errors import ConfigError
from trainer.config import TRAINER_SECTIONS, TrainerConfig


def test_run_config_holds_every_trainer_section_with_its_type():
    """Its own type, or one extending it with the driver's settings (checkpoint.s3)."""
    run_types, trainer_types = typing.get_type_hints(RunConfig), typing.get_type_hints(TrainerConfig)
    for name, kind in trainer_types.items():
        assert issubclass(run_types[name], kind), name


def test_the_trainers_view_carries_every_section_and_resolves_the_checkpoint_dir(tmp_path):
    config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none"])
    view = config.trainer_config()
    assert type(view) is TrainerConfig
    for name in TRAINER_SECTIONS:
        if name != "checkpoint":
            assert getattr(view, name) == getattr(config, name), name
    assert view.checkpoint.save == str((tmp_path / "checkpoints").resolve())
    driver_only = {"s3"}  # the durable tier is the driver's (runmgr/config/s3.py)
    assert {**dataclasses.asdict(view.checkpoint), "save": None} == {
        key: value for key, value in dataclasses.asdict(config.checkpoint).items() if key not in driver_only}


@pytest.mark.parametrize("override, choices", [
    ("cluster.placement_strategy=pack", "[PACK, SPREAD, STRICT_PACK, STRICT_SPREAD]"),
    ("device=gpu", "[auto, cpu, cuda, npu]"),
    ("optim.lr_decay_style=cos", "[cosine, linear, constant]"),
    ("health.compute.dtype=fp8", "[float32, bfloat16, float16]"),
    ("health.fleet.software_mismatch=ignore", "[exclude, warn]"),
])
def test_a_bad_choice_is_one_line_naming_the_key_and_the_choices(override, choices):
    with pytest.raises(ConfigError) as caught:
        load_run_config("demo", [override])
    message = str(caught.value)
    assert message.startswith(override.split("=")[0]) and choices in message and "\n" not in message


def test_the_logbook_keeps_choices_as_the_strings_of_the_yaml(tmp_path):
    config = load_run_config("demo", [f"run.dir={tmp_path}", "cluster.placement_strategy=SPREAD"])
    assert config.cluster.placement_strategy is PlacementStrategy.SPREAD
    data = config_as_dict(config)
    assert data["cluster"]["placement_strategy"] == "SPREAD" and type(data["cluster"]["placement_strategy"]) is str
    assert type(data["device"]) is str and type(data["health"]["compute"]["dtype"]) is str


def test_a_recipe_the_built_in_trainer_cannot_execute_still_loads_for_planning():
    """Tensor and pipeline parallel run, FSDP2 over tensor parallel too (run12); ZeRO-1 over a
    tensor-parallel model does not yet (llama2_70b)."""
    config = load_run_config("llama2_70b", [])
    combination = "parallel.use_distributed_optimizer=true with parallel.tensor_model_parallel_size=8"
    assert config.problems() == [] and f"cannot execute {combination}" in config.unsupported()
    assert load_run_config("run12", []).unsupported() is None


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "60", "600"])
def test_a_cluster_lost_timeout_that_ray_would_beat_or_never_ends_is_refused(value):
    # Ray ends a driver whose head stays silent for 60 s: runmgr must notice first.
    with pytest.raises(ConfigError) as caught:
        load_run_config("demo", [f"controller.cluster_lost_timeout_s={value}"])
    message = str(caught.value)
    assert message.startswith("controller.cluster_lost_timeout_s must be") and "\n" not in message
    if value not in ("nan", "inf", "-inf"):
        assert "> 0 and below 60" in message


def test_the_cluster_lost_timeout_defaults_below_rays_own():
    assert 0 < load_run_config("demo", []).controller.cluster_lost_timeout_s < 60


@pytest.mark.parametrize("override, message", [
    ("watcher.loss_spike.window=1", "watcher.loss_spike: need 3 <= min_history (10) <= window (1)"),
    ("watcher.grad_spike.recovery_points=0", "watcher.grad_spike: recovery_points and grace_steps must be at least 1"),
    ("watcher.hang.step.min_s=0", "watcher.hang.step: need 0 < min_s <= initial_s <= max_s"),
    ("watcher.straggler.ratio=0.5", "watcher.straggler: need ratio > 1"),
])
def test_every_detector_s_range_check_runs_at_launch(override, message):
    # The run's config is built by OmegaConf, not section by section: the nested checks
    # of the watcher must still refuse a threshold the detector cannot work with.
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_run_config("demo", [override])


@pytest.mark.parametrize("overrides, says", [
    (["controller.warm_spares=1"], "controller.warm_spares=1 needs in-memory snapshots to restore from: set "
                                   "checkpoint.memory_interval"),
    (["controller.warm_spares=-1"], "controller.warm_spares must be >= 0"),
    (["controller.warm_spares=1", "checkpoint.memory_interval=1", "trainer.kind=megatron"],
     "controller.warm_spares is for the built-in trainer"),
    (["checkpoint.memory_interval=-2"], "checkpoint.memory_interval must be >= 0"),
    (["checkpoint.memory_interval=1"], "checkpoint.memory_interval=1 keeps state for warm restarts, which need a "
                                       "ready spare: set controller.warm_spares=1"),
])
def test_warm_restart_settings_that_cannot_work_are_refused_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as caught:
        load_run_config("demo", overrides)
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("layout", [["parallel.use_distributed_optimizer=true"], ["parallel.use_torch_fsdp2=true"],
                                    ["parallel.tensor_model_parallel_size=2"],
                                    ["parallel.pipeline_model_parallel_size=2",
                                     "model.untie_embeddings_and_output_weights=true"]])
def test_warm_restarts_are_accepted_for_sharded_and_model_parallel_state(layout):
    # Their snapshots are kept by a buddy rank (trainer/warm.py): no layout is refused any more.
    warm = load_run_config("demo", ["controller.warm_spares=1", "checkpoint.memory_interval=1",
                                    "cluster.num_workers=2", *layout])
    assert warm.controller.warm_spares == 1 and warm.trainer_config().unsupported() is None
