"""``runmgr launch --rehearse``: the rehearsal of run12 and llama2_70b keeps the recipe
(optimizer, schedule shape, precision and scaler, watcher thresholds, policy ladder,
kinds of parallelism) and scales sizes, steps, batch and windows, naming each key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config
from runmgr.rehearsal import load_presets, load_rehearsal, rehearsal_of
from runmgr.errors import ConfigError
from tests import cli

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def rehearsal(conf: str, *overrides: str):
    return load_rehearsal(conf, list(overrides), CONF)


def rows(mapping) -> dict:
    return {row.key: row for row in mapping.rows}


def test_run12_becomes_tp2_dp2_fsdp2_of_a_small_opt_model_with_the_same_recipe():
    real = load_run_config("run12", [], CONF)
    small, mapping = rehearsal("run12")
    assert (small.parallel.tensor_model_parallel_size, small.parallel.pipeline_model_parallel_size) == (2, 1)
    assert small.parallel.use_torch_fsdp2 and small.world_size == 4 and small.data_parallel_size(4) == 2
    assert small.cluster.address is None and small.cluster.local_nodes == 5  # one spare for an excluded node
    m = small.model
    assert (m.family, m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, m.vocab_size) == \
        ("opt", 2, 64, 4, 64, 256)
    assert m.ffn_hidden_size / m.hidden_size == real.model.ffn_hidden_size / real.model.hidden_size
    assert m.hidden_dropout == real.model.hidden_dropout and m.recompute_granularity == "full"
    # The optimizer and the precision are the real run's, the schedule's shape too.
    for key in ("lr", "min_lr", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "clip_grad", "lr_decay_style"):
        assert getattr(small.optim, key) == getattr(real.optim, key), key
    assert small.precision == real.precision and small.precision.fp16
    assert small.training.train_iters == 200
    assert small.optim.lr_warmup_iters == round(2000 / 147661 * 200) == 3
    # Its own run directory, marked as a rehearsal of run12.
    assert small.run.name == "run12-rehearsal" and small.run_dir() == Path("runs/run12-rehearsal")
    assert small.rehearse.of == "run12" and small.run.number == 12
    assert small.checkpoint.save_interval == 20 and not small.checkpoint.s3.enabled
    # The machine faults of OPT's Run 12 (its data faults need a model that has learned: conf/chaos/rehearsal.yaml).
    assert [str(f.kind) for f in small.chaos.faults] == ["kill_worker", "hang_rank", "slow_rank", "checkpoint_fail",
                                                         "device_ecc"]
    table = rows(mapping)
    assert table["parallel.tensor_model_parallel_size"].real == 8
    assert table["parallel.tensor_model_parallel_size"].rehearsal == 2
    assert table["data-parallel size"].real == 124 and table["data-parallel size"].rehearsal == 2
    assert table["precision.fp16"].kept and "CPU" in table["precision.fp16"].reason
    assert table["optim.lr_warmup_iters"].rehearsal == 3 and "1.35%" in table["optim.lr_warmup_iters"].reason
    assert all(row.reason for row in mapping.rows)


def test_llama2_70b_becomes_tp2_pp2_with_its_distributed_optimizer_and_grouped_query_attention():
    small, mapping = rehearsal("llama2_70b")
    par = small.parallel
    assert (par.tensor_model_parallel_size, par.pipeline_model_parallel_size, small.world_size) == (2, 2, 4)
    # At DP 1 the distributed optimizer would hold one shard, the whole state: the rehearsal says so and runs without.
    assert not par.use_distributed_optimizer and not par.use_torch_fsdp2
    zero1 = rows(mapping)["parallel.use_distributed_optimizer"]
    assert zero1.real and not zero1.rehearsal and "one shard" in zero1.reason
    m = small.model
    assert m.family == "llama" and m.num_layers % 2 == 0 and m.untie_embeddings_and_output_weights
    assert m.num_query_groups is not None and m.num_query_groups % 2 == 0
    assert m.num_attention_heads % m.num_query_groups == 0 and m.num_query_groups < m.num_attention_heads
    assert small.precision.bf16
    assert small.optim.lr_warmup_fraction == 0.01 and small.optim.lr_decay_style == "cosine"
    assert small.run.name == "llama2_70b-rehearsal" and small.device == "cpu"
    assert rows(mapping)["data-parallel size"].real == 8 and rows(mapping)["data-parallel size"].rehearsal == 1
    # Its nodes share this machine: their speeds are not compared (a busy machine excluded the spare).
    assert small.health.fleet.min_nodes > small.cluster.local_nodes and not small.health.skip
    assert "share this machine's cores" in rows(mapping)["health.fleet.min_nodes"].reason


def test_the_watcher_and_policy_keep_their_thresholds_and_budgets_and_take_the_windows_of_the_preset():
    real = load_run_config("run12", ["watcher.loss_spike.z_threshold=5.0", "policy.restarts.max_restarts=7"], CONF)
    small, mapping = rehearsal_of(real, load_presets(CONF, real.rehearse))
    assert small.watcher.loss_spike.z_threshold == 5.0 and small.policy.restarts.max_restarts == 7
    assert small.watcher.loss_spike.grace_steps == 10 and small.policy.rollback.margin_steps == 10
    assert small.watcher.hang.step.initial_s == 10.0 and small.watcher.hang.safety_factor == real.watcher.hang.safety_factor
    assert small.policy.instability.ladder == real.policy.instability.ladder
    scaled = {row.key for row in mapping.scaled}
    assert {"watcher.loss_spike.grace_steps", "policy.rollback.margin_steps", "watcher.hang.step.initial_s"} <= scaled
    assert not any("z_threshold" in key or "max_restarts" in key for key in scaled)


def test_a_run_dir_given_is_honoured_the_rehearsal_s_beside_it(tmp_path):
    small, mapping = rehearsal("run12", f"run.dir={tmp_path / 'llama'}")
    assert small.run_dir() == tmp_path / "llama-rehearsal" and small.run.name == "run12-rehearsal"
    assert rows(mapping)["run.dir"].rehearsal == str(tmp_path / "llama-rehearsal")
    assert rehearsal("run12")[0].run_dir() == Path("runs/run12-rehearsal")  # none given: under runs/, as before


def test_the_rehearse_section_sizes_it():
    small, _ = rehearsal("run12", "rehearse.train_iters=300", "rehearse.chaos=none", "rehearse.hidden_size=128")
    assert small.training.train_iters == 300 and small.optim.lr_warmup_iters == round(2000 / 147661 * 300)
    assert not small.chaos.enabled and small.model.hidden_size == 128


@pytest.mark.parametrize("overrides, expected", [
    (["rehearse.num_attention_heads=3", "rehearse.hidden_size=63"], "must be divisible by the rehearsal's tensor-parallel"),
    (["rehearse.global_batch_size=12"], "rehearse.global_batch_size (12) must be a multiple"),
    (["rehearse.chaos=nosuch"], "no conf/chaos/nosuch.yaml"),
    (["rehearse.train_iters=80"], "reaches step"),  # the rehearsal schedule's last fault is at step 90
    (["rehearse.train_iters=0"], "rehearse.train_iters must be a positive integer"),
    (["trainer.kind=megatron"], "trainer.kind=megatron cannot be rehearsed"),
])
def test_a_rehearsal_it_cannot_run_is_refused_with_one_line(overrides, expected):
    with pytest.raises(ConfigError) as error:
        rehearsal("run12", *overrides)
    assert expected in str(error.value) and "\n" not in str(error.value)


def runmgr(*args: str) -> subprocess.CompletedProcess:
    return cli.runmgr(*args, cwd=ROOT, timeout=180)


def test_dry_run_explains_the_mapping_then_the_rehearsals_plan():
    result = runmgr("launch", "conf=run12", "--rehearse", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Rehearsal of run12" in out
    scaled, kept = out.split("  scaled:")[1].split("  kept:")
    assert "parallel.tensor_model_parallel_size" in scaled and "8 -> 2" in scaled
    assert "model.hidden_size" in scaled and "12288 -> 64" in scaled
    assert "optim.lr_warmup_iters" in scaled and "2000 -> 3" in scaled
    assert "run12 -> run12-rehearsal" in scaled
    for key in ("optim.adam_beta2", "optim.clip_grad", "precision.fp16", "precision.initial_loss_scale",
                "parallel.use_torch_fsdp2", "model.family"):
        assert key in kept, key
    assert "Plan for run12-rehearsal" in out and "world size 4 = TP 2 x PP 1 x DP 2" in out


def test_rehearse_settings_without_rehearse_are_refused():
    result = runmgr("launch", "conf=demo", "--dry-run", "rehearse.train_iters=300")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "add --rehearse" in result.stderr
