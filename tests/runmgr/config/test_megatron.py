"""trainer.kind=megatron and the megatron section: what composes, what is refused with one line,
and the job's own arguments as the truth of runmgr's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config
from runmgr.config.megatron import MegatronFlavor, TrainerKind
from runmgr.errors import ConfigError
from runmgr.megatron.job import aligned, effective_args


def job_args(save: Path, *extra: str) -> str:
    base = ["--save", str(save), "--train-iters", "40", "--global-batch-size", "16", "--micro-batch-size", "2",
            "--seq-length", "128", "--lr", "3.0e-4", *extra]
    return "megatron.args=[" + ",".join(base) + "]"


def megatron_conf(tmp_path: Path, *overrides: str, script: str = "-m trainer"):
    return load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron",
                                    f"megatron.script={script}", *overrides])


def refusal(tmp_path: Path, *overrides: str, script: str = "-m trainer") -> str:
    with pytest.raises(ConfigError) as caught:
        megatron_conf(tmp_path, *overrides, script=script)
    return str(caught.value)


def test_a_megatron_job_composes_on_any_conf_and_saves_where_its_args_say(tmp_path):
    config = megatron_conf(tmp_path, "megatron.flavor=mindspeed_llm", "megatron.nproc_per_node=2",
                           "megatron.env={NCCL_DEBUG: WARN}", job_args(tmp_path / "ckpt"))
    assert config.trainer.kind == TrainerKind.megatron and config.megatron.flavor == MegatronFlavor.mindspeed_llm
    assert config.megatron.env == {"NCCL_DEBUG": "WARN"} and config.megatron.module() == "trainer"
    assert config.checkpoint_dir() == tmp_path / "ckpt"


def test_the_built_in_trainer_stays_the_default_and_refuses_megatron_settings(tmp_path):
    assert load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none"]).trainer.kind == TrainerKind.builtin
    with pytest.raises(ConfigError, match="megatron.* is set but trainer.kind is builtin"):
        load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "megatron.nproc_per_node=2"])


@pytest.mark.parametrize("missing", ["--save", "--train-iters", "--global-batch-size"])
def test_each_flag_runmgr_reads_is_required(tmp_path, missing):
    args = ["--save", str(tmp_path), "--train-iters", "40", "--global-batch-size", "16"]
    at = args.index(missing)
    del args[at:at + 2]
    assert refusal(tmp_path, "megatron.args=[" + ",".join(args) + "]").startswith(
        f"megatron.args must contain {missing}: ")


@pytest.mark.parametrize("extra, said", [
    (("--ckpt-step", "10"), "must not contain --ckpt-step"),
    (("--no-load-optim",), "must not contain --no-load-optim"),
    (("--rampup-batch-size", "4", "4", "100"), "--rampup-batch-size is not supported"),
    (("--load", "/elsewhere"), "--load /elsewhere differs from --save"),
    (("--iterations-to-skip", "0"), "--iterations-to-skip takes 1-indexed iterations"),
])
def test_flags_runmgr_owns_or_cannot_follow_are_refused(tmp_path, extra, said):
    assert said in refusal(tmp_path, job_args(tmp_path / "ckpt", *extra))


def test_a_load_from_the_save_directory_is_accepted(tmp_path):
    config = megatron_conf(tmp_path, job_args(tmp_path / "ckpt", "--load", str(tmp_path / "ckpt")))
    assert config.checkpoint_dir() == tmp_path / "ckpt"


def test_ranks_per_node_must_divide_the_world(tmp_path):
    assert "must be a multiple of megatron.nproc_per_node (3)" in refusal(
        tmp_path, "megatron.nproc_per_node=3", job_args(tmp_path / "c"))
    assert "megatron.nproc_per_node must be >= 1" in refusal(tmp_path, "megatron.nproc_per_node=0",
                                                             job_args(tmp_path / "c"))


def test_a_script_must_be_a_file(tmp_path):
    said = refusal(tmp_path, job_args(tmp_path / "c"), script=str(tmp_path / "pretrain_gpt.py"))
    assert said.startswith(f"megatron.script '{tmp_path / 'pretrain_gpt.py'}' is not a file")
    (tmp_path / "pretrain_gpt.py").write_text("")
    assert megatron_conf(tmp_path, job_args(tmp_path / "c"), script=str(tmp_path / "pretrain_gpt.py"))


def test_s3_copies_are_refused_for_a_megatron_job(tmp_path):
    said = refusal(tmp_path, job_args(tmp_path / "c"), "checkpoint.s3.bucket=runs")
    assert "checkpoint.s3 is not supported yet for trainer.kind=megatron" in said


@pytest.mark.parametrize("key", ["precision.embedding_bf16", "optim.decay_1d_weights"])
@pytest.mark.parametrize("with_script", [False, True])
def test_settings_without_a_megatron_flag_are_refused_with_one_line(tmp_path, key, with_script):
    # Derived args could not carry them; a user's own args would never see them.
    if with_script:
        (tmp_path / "pretrain_gpt.py").write_text("")
    overrides = [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron", f"{key}=true"]
    if with_script:
        overrides += [f"megatron.script={tmp_path / 'pretrain_gpt.py'}", job_args(tmp_path / "c")]
    with pytest.raises(ConfigError) as caught:
        load_run_config("demo", overrides)
    said = str(caught.value)
    assert said.startswith(f"{key}=true has no Megatron flag") and f"set {key}=false" in said and "\n" not in said


def test_faults_that_rewrite_the_built_in_trainers_inputs_are_refused_with_a_user_script(tmp_path):
    (tmp_path / "pretrain_gpt.py").write_text("")
    with pytest.raises(ConfigError, match="chaos faults garbage_data, recurring_instability .*reach the job only"):
        load_run_config("demo", [f"run.dir={tmp_path}", "trainer.kind=megatron",
                                 f"megatron.script={tmp_path / 'pretrain_gpt.py'}", job_args(tmp_path / "c")])


def test_faults_that_rewrite_inputs_are_refused_with_the_dialects_own_args_too(tmp_path):
    # The garbage copy reaches the job through derived args only; explicit args would never carry it.
    with pytest.raises(ConfigError, match="chaos faults garbage_data, recurring_instability .*reach the job only"):
        load_run_config("demo", [f"run.dir={tmp_path}", "trainer.kind=megatron", "megatron.script=-m trainer",
                                 job_args(tmp_path / "c")])


def test_pauses_carried_out_by_the_built_in_reporter_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="pause_at_step are carried out by the built-in trainer's reporter"):
        load_run_config("demo", [f"run.dir={tmp_path}", "trainer.kind=megatron", "chaos=pause_at_step"])


def test_the_jobs_args_are_the_truth_of_iterations_batches_and_checkpoints(tmp_path):
    config = aligned(megatron_conf(tmp_path, job_args(tmp_path / "ckpt")))
    assert (config.training.train_iters, config.training.global_batch_size, config.training.micro_batch_size,
            config.model.seq_length) == (40, 16, 2, 128)
    assert config.checkpoint.save == str(tmp_path / "ckpt")
    assert effective_args(config)[:2] == ["--save", str(tmp_path / "ckpt")]


def test_without_script_or_args_the_conf_is_spelled_as_megatron_flags(tmp_path):
    pytest.importorskip("trainer.megatron_args", reason="trainer/megatron_args.py (the built-in trainer's "
                                                        "Megatron dialect) is built by another branch")
    config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron"])
    lined_up = aligned(config)
    assert lined_up.training == config.training and lined_up.model.seq_length == config.model.seq_length
    assert lined_up.checkpoint_dir() == config.checkpoint_dir()


def test_seed_000s_llama2_70b_on_mindspeed_composes_as_a_megatron_job(tmp_path):
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    config = aligned(load_run_config("llama2_70b_mindspeed", [f"megatron.script={script}", f"run.dir={tmp_path}"]))
    assert config.drives_megatron and config.megatron.flavor == "mindspeed_llm"
    assert config.world_size == 512 and config.world_size % config.megatron.nproc_per_node == 0
    assert (config.training.global_batch_size, config.model.seq_length) == (1024, 4096)
    assert config.megatron.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_a_local_norms_interval_override_is_refused_for_a_megatron_job(tmp_path):
    """A Megatron job reports no per-weight gradient norms: asking for them is refused with one line;
    the conf's own value (the demo records every step) is not expressed in Megatron's flags."""
    with pytest.raises(ConfigError) as caught:
        load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron",
                                 "training.local_norms_interval=10"])
    said = str(caught.value)
    assert said.startswith("training.local_norms_interval is not honoured with trainer.kind=megatron")
    assert "\n" not in said and "docs/local_norms.md" in said
    assert load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron"])
    builtin = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "training.local_norms_interval=10"])
    assert builtin.training.local_norms_interval == 10


@pytest.mark.parametrize("override", ["megatron.env={NCCL_DEBUG:WARN,HCCL_CONNECT_TIMEOUT:3600}",
                                      "megatron.env={NCCL_DEBUG: WARN, HCCL_CONNECT_TIMEOUT: '3600'}"])
def test_megatron_env_as_a_mapping_composes_as_hydra_reads_it(tmp_path, override):
    """Issue 26 case 7: ``{K:V}`` is Hydra's mapping K -> V (YAML alone read a key 'K:V' without a value)."""
    config = megatron_conf(tmp_path, override, job_args(tmp_path / "c"))
    assert config.megatron.env == {"NCCL_DEBUG": "WARN", "HCCL_CONNECT_TIMEOUT": "3600"}


def test_a_mapping_merges_into_the_confs_env_and_plus_adds_one_entry(tmp_path):
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    base = [f"megatron.script={script}", f"run.dir={tmp_path}"]
    config = load_run_config("llama2_70b_mindspeed", [*base, "megatron.env={NCCL_DEBUG:WARN}",
                                                      "+megatron.env.TASK_QUEUE_ENABLE=1"])
    assert config.megatron.env["NCCL_DEBUG"] == "WARN" and config.megatron.env["TASK_QUEUE_ENABLE"] == "1"
    assert config.megatron.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the conf's entries stay


@pytest.mark.parametrize("override, said", [
    ("megatron.env={NCCL_DEBUG:", "bad override 'megatron.env={NCCL_DEBUG:': "),
    ("megatron.env={A:[1,2]}", "megatron.env.A must be one value (a string), got [1, 2]"),
    ("+training.seed=3", "bad override '+training.seed=3': write it without '+' (training.seed=3)"),
])
def test_a_mapping_override_that_cannot_compose_is_one_line_naming_the_spelling(tmp_path, override, said):
    line = refusal(tmp_path, override, job_args(tmp_path / "c"))
    assert said in line and "\n" not in line
    if override.startswith("megatron.env={NCCL"):
        assert "write a mapping as megatron.env={K1:V1,K2:V2}" in line and "megatron.env.K1=V1" in line
