"""Saving and loading through torch.distributed.checkpoint with a real
(one-rank, gloo) process group: the async save holds the state of its own
step even when training goes on, and a load verifies first."""

from __future__ import annotations

import dataclasses
import pickle
import shutil

import pytest
import torch

from trainer.checkpoint import Checkpointer, config_hash, config_shapes, load_checkpoint
from trainer.config import CheckpointConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainerConfig
from trainer.distributed import DistEnv, destroy_process_groups, init_process_groups
from tests.faults.checkpoint_damage import craft_metadata, rewrite_manifest
from trainer.errors import BadCheckpointError, CheckpointError
from trainer.manifest import find_latest_verified, list_checkpoints, read_manifest
from trainer.model import build_model
from trainer.optim import build_optimizer, effective_settings
from trainer.precision import LossScaler

MODEL = ModelConfig(num_layers=1, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2,
                    seq_length=8, max_position_embeddings=8, vocab_size=32)
FP16 = PrecisionConfig(fp16=True, initial_loss_scale=1024.0)


@pytest.fixture
def group():
    ckpt_group = init_process_groups(DistEnv(), "gloo", timeout_s=30)
    yield ckpt_group
    destroy_process_groups()


def trained(steps: int = 2):
    torch.manual_seed(0)
    model = build_model(MODEL)
    optimizer = build_optimizer(model, OptimConfig())
    for _ in range(steps):
        model(torch.randint(0, 32, (2, 8))).logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_async_save_holds_the_state_of_its_step_while_training_goes_on(tmp_path, group):
    model, optimizer = trained()
    scaler = LossScaler.from_config(FP16)
    scaler.update(overflow=True)
    saved_weights = snapshot(model)
    saved_moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), async_save=True), 0, group)
    assert checkpointer.save(2, model, optimizer, scaler, consumed_samples=16, fields={"subrun": "0.00"}) == []
    with torch.no_grad():  # training goes on while the files are written
        for param in model.parameters():
            param.add_(1.0)
    optimizer.state[next(iter(optimizer.state))]["exp_avg"].add_(1.0)
    done = checkpointer.wait()
    assert done is not None and done.step == 2 and done.path == tmp_path / "step_00000002"
    assert read_manifest(done.path)["subrun"] == "0.00"

    fresh_model = build_model(MODEL)
    fresh_optimizer = build_optimizer(fresh_model, OptimConfig())
    fresh_scaler = LossScaler.from_config(FP16)
    loaded = load_checkpoint(done.path, fresh_model, fresh_optimizer, fresh_scaler, load_optimizer=True, group=group)
    assert (loaded.step, loaded.consumed_samples) == (2, 16)
    for name, tensor in fresh_model.state_dict().items():
        assert torch.equal(tensor, saved_weights[name]), name
    for state, expected in zip(fresh_optimizer.state.values(), saved_moments):
        assert torch.equal(state["exp_avg"], expected)
    assert effective_settings(fresh_optimizer)[0].step == 2
    assert (fresh_scaler.scale, fresh_scaler.overflows_left) == (1024.0, 1)


def test_loading_without_the_optimizer_leaves_adam_fresh(tmp_path, group):
    model, optimizer = trained()
    Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), async_save=False), 0, group).save(
        2, model, optimizer, LossScaler(), 16, {})
    fresh_model = build_model(MODEL)
    fresh_optimizer = build_optimizer(fresh_model, OptimConfig())
    load_checkpoint(tmp_path / "step_00000002", fresh_model, fresh_optimizer, LossScaler(), load_optimizer=False,
                    group=group)
    assert torch.equal(fresh_model.embedding.weight, model.embedding.weight)
    assert fresh_optimizer.state == {}


def test_a_checkpoint_that_does_not_verify_is_not_loaded(tmp_path, group):
    model, optimizer = trained()
    Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), async_save=False), 0, group).save(
        2, model, optimizer, LossScaler(), 16, {})
    path = tmp_path / "step_00000002"
    distcp = next(path.glob("*.distcp"))
    distcp.write_bytes(distcp.read_bytes()[:100])
    fresh_model = build_model(MODEL)
    before = snapshot(fresh_model)
    with pytest.raises(CheckpointError, match=r"step_00000002: file __0_0.distcp is 100 bytes.*\(truncated\)"):
        load_checkpoint(path, fresh_model, build_optimizer(fresh_model, OptimConfig()), LossScaler(), True, group)
    assert all(torch.equal(v, before[k]) for k, v in fresh_model.state_dict().items())


def saved_at(tmp_path, group, *steps):
    """Checkpoints of a model trained to each of ``steps`` (one run)."""
    model, optimizer = trained(0)
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), async_save=False), 0, group)
    for step in steps:
        model(torch.randint(0, 32, (2, 8))).logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        checkpointer.save(step, model, optimizer, LossScaler(), 8 * step, {"consumed_samples": 8 * step})
    return [tmp_path / f"step_{step:08d}" for step in steps]


def test_a_checkpoint_whose_data_disagree_with_its_manifest_is_refused_naming_it(tmp_path, group):
    first, second = saved_at(tmp_path, group, 1, 2)
    for data in second.iterdir():
        if data.name != "manifest.json":
            data.unlink()
    for data in first.iterdir():
        if data.name != "manifest.json":
            shutil.copy2(data, second / data.name)  # step 1's data under step 2's manifest ...
    rewrite_manifest(second)  # ... which vouches for them: it verifies
    fresh_model = build_model(MODEL)
    before = snapshot(fresh_model)
    with pytest.raises(BadCheckpointError) as refused:
        load_checkpoint(second, fresh_model, build_optimizer(fresh_model, OptimConfig()), LossScaler(), True, group)
    assert str(refused.value) == f"checkpoint {second} (step 2) is unusable: its data hold step 1, its manifest says 2"
    assert all(torch.equal(v, before[k]) for k, v in fresh_model.state_dict().items())
    # Raised in a Ray actor, it reaches the driver pickled, with its message whole.
    assert str(pickle.loads(pickle.dumps(refused.value))) == str(refused.value)


def test_a_crafted_metadata_is_refused_before_the_load_and_runs_nothing(tmp_path, group):
    (path,) = saved_at(tmp_path, group, 2)
    marker = tmp_path / "code-ran"
    craft_metadata(path, marker)
    fresh_model = build_model(MODEL)
    with pytest.raises(BadCheckpointError, match=rf"checkpoint {path} \(step 2\) is unusable: step_00000002: file "
                                                 r"\.metadata is not plain DCP metadata: it asks for io\.open"):
        load_checkpoint(path, fresh_model, build_optimizer(fresh_model, OptimConfig()), LossScaler(), True, group)
    assert not marker.exists()


def test_the_manifest_records_the_shapes_a_model_built_on_the_meta_device_predicts(tmp_path, group):
    model, optimizer = trained()
    Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), async_save=False), 0, group).save(
        2, model, optimizer, LossScaler(), 16, {})
    recorded = read_manifest(tmp_path / "step_00000002")["parameters"]
    assert recorded == {name: list(t.shape) for name, t in model.state_dict().items()}
    assert config_shapes(MODEL) == recorded


def test_a_model_of_another_shape_is_refused_before_anything_is_loaded(tmp_path, group):
    model, optimizer = trained()
    Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), async_save=False), 0, group).save(
        2, model, optimizer, LossScaler(), 16, {})
    wider = build_model(dataclasses.replace(MODEL, hidden_size=32, ffn_hidden_size=64))
    before = snapshot(wider)
    with pytest.raises(CheckpointError, match=r"embedding.weight is \[32, 16\] there, \[32, 32\] here \(and \d+ more\)"):
        load_checkpoint(tmp_path / "step_00000002", wider, build_optimizer(wider, OptimConfig()), LossScaler(), True, group)
    assert all(torch.equal(v, before[k]) for k, v in wider.state_dict().items())


def test_keep_last_prunes_older_checkpoints_but_never_the_resumed_one(tmp_path, group):
    model, optimizer = trained(1)
    protect = (tmp_path / "step_00000001",)
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), keep_last=2, async_save=True), 0,
                                group, protect=protect)
    finished = []
    for step in (1, 2, 3, 4):
        finished += checkpointer.save(step, model, optimizer, LossScaler(), 8 * step, {})
    finished.append(checkpointer.wait())
    assert [c.step for c in finished] == [1, 2, 3, 4]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001", "step_00000003", "step_00000004"]
    assert find_latest_verified(tmp_path).step == 4


def test_keep_last_zero_deletes_nothing(tmp_path, group):
    """What runmgr hands the trainer: its driver decides what is kept."""
    model, optimizer = trained(1)
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(save=str(tmp_path), keep_last=0, async_save=True), 0, group)
    for step in (1, 2, 3):
        checkpointer.save(step, model, optimizer, LossScaler(), 8 * step, {})
    checkpointer.wait()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001", "step_00000002", "step_00000003"]


def test_config_hash_ignores_run_length_and_checkpoint_placement():
    base = TrainerConfig()
    longer = TrainerConfig()
    longer.training.train_iters, longer.checkpoint.save = 10_000, "/elsewhere"
    other_lr = TrainerConfig()
    other_lr.optim.lr = 5e-4
    assert config_hash(base) == config_hash(longer) != config_hash(other_lr)
