"""The training loop with real ranks: two processes, gloo on 127.0.0.1.

The key property: train N steps uninterrupted, or train to a checkpoint and
resume from it in a fresh process group -- the losses after the resume are
bit-for-bit the same. The checkpoint was written asynchronously while
training went on, so this also proves it holds the state of its own step.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from trainer import DistEnv, NullReporter, ResumePlan, TrainerConfig, train
from trainer.errors import CheckpointError, TrainerConfigError

from trainer.cli import config_from_dict
from trainer.model import build_model
from trainer.manifest import find_latest_verified, list_checkpoints, read_manifest
from trainer.optim import lr_at

TRAIN_ITERS = 6


class ListReporter:
    def __init__(self) -> None:
        self.steps, self.checkpoints, self.beats, self.starts, self.norms = [], [], [], [], []

    def started(self, report) -> None:
        self.starts.append(report)

    def step(self, report) -> None:
        self.steps.append(report)

    def checkpoint(self, report) -> None:
        self.checkpoints.append(report)

    def local_norms(self, report) -> None:
        self.norms.append(report)

    def heartbeat(self, beat) -> None:
        self.beats.append(beat)
SAVE_INTERVAL = 3


def small_config(save_dir: Path, **sections) -> dict:
    config = {
        "device": "cpu",
        "model": {"family": "llama", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 160,
                  "num_attention_heads": 4, "num_query_groups": 2, "seq_length": 32, "max_position_embeddings": 32,
                  "hidden_dropout": 0.1, "attention_dropout": 0.1},  # dropout: the per-step reseed is exercised
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "lr_warmup_iters": 2, "adam_beta2": 0.95},
        "data": {"corpus_max_bytes": 200_000},
        "training": {"micro_batch_size": 2, "global_batch_size": 8, "train_iters": TRAIN_ITERS, "seed": 7,
                     "deterministic": True},
        "parallel": {"dist_timeout_s": 20.0},
        "checkpoint": {"save": str(save_dir), "save_interval": SAVE_INTERVAL, "keep_last": 3, "async_save": True},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


@pytest.fixture(scope="module")
def uninterrupted(launch_ranks, tmp_path_factory):
    """Two ranks train TRAIN_ITERS steps, saving asynchronously every SAVE_INTERVAL."""
    save_dir = tmp_path_factory.mktemp("ckpt")
    ranks = launch_ranks(small_config(save_dir))
    results = ranks.wait()
    return {"save_dir": save_dir, "results": results, "ranks": ranks}


def resume_plan(save_dir: Path, step: int, **changes) -> dict:
    return {"subrun": "0.01", "start_checkpoint": str(save_dir / f"step_{step:08d}"), **changes}


def copy_of_checkpoint(src_dir: Path, step: int, dst_dir: Path) -> Path:
    """Resume tests write into their own directory, so they do not prune or
    retire the shared run's checkpoints."""
    import shutil

    target = dst_dir / f"step_{step:08d}"
    shutil.copytree(src_dir / f"step_{step:08d}", target)
    return dst_dir


def test_uninterrupted_run_reports_every_step_and_checkpoint(uninterrupted):
    rank0, rank1 = uninterrupted["results"]
    assert len(rank0["losses"]) == TRAIN_ITERS
    assert rank0["losses"] == rank1["losses"]  # every rank sees the same global loss
    steps = uninterrupted["ranks"].events(0, "step")
    assert [s["step"] for s in steps] == list(range(1, TRAIN_ITERS + 1))
    assert steps[-1]["consumed_samples"] == TRAIN_ITERS * 8
    assert len(steps[0]["compute_times"]) == 2
    assert [c["step"] for c in uninterrupted["ranks"].events(0, "checkpoint")] == [3, 6]
    assert uninterrupted["ranks"].events(1, "step") == []  # only rank 0 reports steps
    latest = find_latest_verified(uninterrupted["save_dir"])
    assert latest.step == TRAIN_ITERS and latest.rejected == []
    assert read_manifest(list_checkpoints(uninterrupted["save_dir"])[0])["consumed_samples"] == 3 * 8


def test_resumed_run_reproduces_losses_bit_for_bit(uninterrupted, launch_ranks, tmp_path):
    save_dir = copy_of_checkpoint(uninterrupted["save_dir"], SAVE_INTERVAL, tmp_path)
    ranks = launch_ranks(small_config(save_dir), resume_plan(save_dir, SAVE_INTERVAL))
    resumed = ranks.wait()[0]
    assert resumed["start_step"] == SAVE_INTERVAL
    assert resumed["optimizer_at_start"][0]["step"] == SAVE_INTERVAL  # Adam state came back
    expected = uninterrupted["results"][0]["losses"][SAVE_INTERVAL:]
    assert resumed["losses"] == expected  # exact float equality, not approx


def test_a_killed_peer_surfaces_as_an_error_on_the_survivor(launch_ranks, tmp_path):
    config = small_config(tmp_path, training={"train_iters": 500}, checkpoint={"save_interval": 1000})
    ranks = launch_ranks(config)
    deadline = time.monotonic() + 300  # a limit on waiting, not a claim about speed
    while not [e for e in ranks.events(1, "heartbeat") if e["step"] >= 3]:
        assert time.monotonic() < deadline, "rank 1 never reached step 3"
        assert ranks.procs[1].poll() is None, ranks.stderr(1)
        time.sleep(0.05)
    os.kill(ranks.procs[1].pid, signal.SIGKILL)
    ranks.procs[0].wait(timeout=120)
    assert ranks.procs[0].returncode not in (0, None)
    survivor = ranks.stderr(0)
    assert "RuntimeError" in survivor or "DistBackendError" in survivor
    # The dead peer is noticed by its closed socket, not by the collective timeout.
    noticed = ("closed by peer", "reset by peer", "Broken pipe")
    assert "Timed out" not in survivor and any(text in survivor for text in noticed), survivor[-2000:]


# --- In-process, one rank: train() is also what a Ray actor calls in its own process.


@pytest.fixture
def restore_torch_globals():
    """train() sets process-wide torch switches (deterministic kernels, thread
    count); put them back so other tests in this process are unaffected."""
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)


def one_rank_config(save_dir: Path, **sections) -> TrainerConfig:
    config = small_config(save_dir, **sections)
    config["training"] = {**config["training"], "micro_batch_size": 4, "global_batch_size": 8}
    return config_from_dict(config)


@pytest.fixture
def three_steps(tmp_path, restore_torch_globals) -> Path:
    """A single-rank run stopped at step 3 with a checkpoint (beta2 0.95)."""
    result = train(one_rank_config(tmp_path, training={"train_iters": 3}), ResumePlan(), NullReporter(), DistEnv())
    assert result.last_checkpoint == str(tmp_path / "step_00000003")
    return tmp_path / "step_00000003"


def test_resume_reapplies_config_betas_over_the_checkpoint(three_steps):
    """OPT 12.35: loading optimizer state silently restored the old betas."""
    config = one_rank_config(three_steps.parent, optim={"adam_beta2": 0.98, "adam_eps": 1e-6}, training={"train_iters": 4})
    result = train(config, ResumePlan(start_checkpoint=str(three_steps)), NullReporter(), DistEnv())
    decay, no_decay = result.optimizer_at_start
    for group in (decay, no_decay):
        assert group.betas == (0.9, 0.98) and group.eps == 1e-6
        assert group.step == 3 and group.moment_norm > 0  # the moments did come back
    assert decay.weight_decay == 0.1 and no_decay.weight_decay == 0.0


def test_reset_optimizer_keeps_weights_and_starts_adam_afresh(three_steps):
    config = one_rank_config(three_steps.parent, training={"train_iters": 5})
    plain = train(config, ResumePlan(start_checkpoint=str(three_steps)), NullReporter(), DistEnv())
    reporter = ListReporter()
    plan = ResumePlan(start_checkpoint=str(three_steps), reset_optimizer=True, rewarmup_iters=4)
    reset = train(config, plan, reporter, DistEnv())
    for group in reset.optimizer_at_start:
        assert group.step == 0 and group.moment_norm == 0.0 and group.betas == (0.9, 0.95)
    # ...and the reporter is told so when the sub-run starts, for the logbook.
    (start,) = reporter.starts
    assert start.reset_optimizer and start.start_step == 3
    assert all(g["step"] == 0 and g["moment_norm"] == 0.0 and tuple(g["betas"]) == (0.9, 0.95) for g in start.optimizer)
    # The weights were kept: same batch, same loss before the first update...
    assert reset.losses[0] == plain.losses[0]
    # ...and the update differs (fresh moments), so the next loss does too.
    assert reset.losses[1] != plain.losses[1]
    # A fresh warmup: the first step after the reset runs at 1/4 of the scheduled LR.
    assert reporter.steps[0].lr == pytest.approx(lr_at(4, config.optim, 5) / 4)


class StopAtCheckpoint(ListReporter):
    """Stops the rank (raises) at the first ``checkpoint`` beat after ``step``, as
    runmgr's worker does when its driver is gone."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.after = step

    def heartbeat(self, beat) -> None:
        if beat.phase == "checkpoint" and beat.step > self.after:
            raise RuntimeError("driver gone")
        super().heartbeat(beat)


def test_a_rank_stopped_at_the_beat_before_a_commit_commits_nothing(tmp_path, restore_torch_globals):
    config = one_rank_config(tmp_path, training={"train_iters": 6})  # saves at 3 and 6
    with pytest.raises(RuntimeError, match="driver gone"):
        train(config, ResumePlan(), StopAtCheckpoint(3), DistEnv())
    # Checkpoint 3's files were written; the rank stopped before its manifest (the commit).
    assert (tmp_path / "step_00000003").is_dir() and find_latest_verified(tmp_path).path is None
    assert not (tmp_path / "step_00000006").exists()


def test_resume_from_a_checkpoint_that_does_not_verify_is_refused(three_steps):
    (three_steps / "manifest.json").unlink()
    config = one_rank_config(three_steps.parent, training={"train_iters": 4})
    with pytest.raises(CheckpointError, match="step_00000003: no manifest.json"):
        train(config, ResumePlan(start_checkpoint=str(three_steps)), NullReporter(), DistEnv())
    assert not torch.distributed.is_initialized()  # the process group was torn down


def test_what_the_trainer_cannot_execute_is_refused_with_a_clear_message(tmp_path):
    config = one_rank_config(tmp_path, parallel={"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
                             model={"untie_embeddings_and_output_weights": True})
    with pytest.raises(TrainerConfigError, match="cannot execute parallel.pipeline_model_parallel_size=2 with") as caught:
        train(config, ResumePlan(), NullReporter(), DistEnv(world_size=4))
    assert "\n" not in str(caught.value)


def test_local_norms_on_the_interval_and_the_plans_steps_add_up_to_the_unclipped_norm(tmp_path, restore_torch_globals):
    """Every ``local_norms_interval``-th step and the steps the plan asks for report
    each weight's gradient norm; they are read before clipping, so they add up to the step's (unclipped) global norm."""
    config = one_rank_config(tmp_path, training={"train_iters": 5, "local_norms_interval": 2},
                             optim={"clip_grad": 1e-3})  # clipping bites on every step
    reporter = ListReporter()
    train(config, ResumePlan(local_norms_steps=(3,)), reporter, DistEnv())
    assert [r.step for r in reporter.norms] == [2, 3, 4]
    names = [name for name, _ in build_model(config.model).named_parameters()]
    by_step = {r.step: r for r in reporter.steps}
    for report in reporter.norms:
        assert list(report.norms) == names and report.subrun == "0.00"
        total = math.sqrt(sum(value * value for value in report.norms.values()))
        assert total == pytest.approx(by_step[report.step].grad_norm, rel=1e-5)
        assert by_step[report.step].grad_norm > 1e-3


def test_a_local_norms_interval_of_zero_reports_only_the_plans_steps(tmp_path, restore_torch_globals):
    config = one_rank_config(tmp_path, training={"train_iters": 3, "local_norms_interval": 0})
    reporter = ListReporter()
    train(config, ResumePlan(local_norms_steps=(2, 9)), reporter, DistEnv())
    assert [r.step for r in reporter.norms] == [2]
