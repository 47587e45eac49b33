"""What the training loop holds on a rank between steps, how a sub-run builds it, and what
a checkpoint's manifest records of it.

The loop's state only: a recovery (trainer/recovery) keeps its own, and when it resumes
the session at another step it puts this state back where the re-formed group stands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch.distributed as dist

from trainer.checkpoint import Checkpointer, config_hash, config_shapes, load_checkpoint, retire_checkpoints_after
from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.distributed import DistEnv
from trainer.flops import Throughput
from trainer.optim import (GroupSettings, apply_hyperparameters, decay_iters, effective_settings, set_lr,
                           warmup_iters)
from trainer.parallel.engine import Engine, build_engine
from trainer.plan import ResumePlan
from trainer.precision import LossScaler, embedding_dtype
from trainer.report import Reporter, StartReport
from trainer.rng import rng_snapshot, seed_everything
from trainer.steps import StepContext

SCHEDULE_ORIGIN_FIELD = "schedule_origin"
"""Manifest field: the step at which the LR schedule (re)started (0, or where a
``restart_schedule`` plan began); absent in older checkpoints means 0."""
SKIPPED_SAMPLES_FIELD = "skipped_samples"
"""Manifest field: samples of dummy iterations so far (absent: 0)."""
LR_SCHEDULE_FIELD = "lr_schedule"
"""Manifest field: the schedule the checkpoint was trained with, as Megatron's
scheduler state names it (max_lr and min_lr effective, i.e. times the plan's lr_scale)."""


@dataclass(frozen=True)
class Position:
    """Where the data stream stands after a step: what a rollback puts back."""

    cursor: int
    """Samples of the stream consumed so far."""
    skipped_samples: int = 0
    """Samples of dummy iterations (plan.skip_iterations), over the lineage."""


@dataclass(frozen=True)
class Setup:
    """What a sub-run holds unchanged on this rank from its first step to its last."""

    stream: Any
    """The sample stream (trainer/data): positions and their tokens."""
    reporter: Reporter
    """Where the reports and heartbeats go."""
    optimizer_at_start: tuple[GroupSettings, ...]
    """Optimizer settings in force for the first step, after load and plan."""
    throughput: Optional[Throughput]
    """How a step's tokens/s becomes MFU (rank 0 only)."""


@dataclass
class Session:
    """What one sub-run holds on this rank between steps (the loop's state)."""

    ctx: StepContext
    """Frozen: a re-formed group replaces it (its plan and rendezvous)."""
    setup: Setup
    engine: Engine
    """This rank's share of the model and optimizer."""
    scaler: LossScaler
    checkpointer: Optional[Checkpointer]
    position: Position
    losses: list[float] = field(default_factory=list)
    """Global-batch loss of every step so far, in order."""
    optimizer_bytes: tuple[int, ...] = ()
    """Each rank's optimizer-state bytes, measured once after the first update."""
    last_checkpoint: Optional[str] = None
    """Newest checkpoint this call completed."""


def start_session(config: TrainerConfig, plan: ResumePlan, reporter: Reporter, dist_env: DistEnv, device: Device,
                  ckpt_group: dist.ProcessGroup) -> Session:
    """Build the model and optimizer, load the plan's checkpoint, apply the plan."""
    # Data first: a bad data path should fail before anything expensive.
    stream = build_stream(config, plan)
    seed_everything(config.training.seed)
    engine = build_engine(config, config.layout(dist_env.world_size), dist_env.rank, device,
                          embedding_dtype(config.precision))
    model, optimizer = engine.model, engine.optimizer
    scaler = LossScaler.from_config(config.precision)
    start_step, cursor, resumed_from, manifest = 0, 0, None, {}
    if plan.start_checkpoint:
        loaded = load_checkpoint(Path(plan.start_checkpoint), model, optimizer, scaler,
                                 load_optimizer=not plan.reset_optimizer, group=ckpt_group,
                                 shapes=config_shapes(config.model))
        start_step, cursor, resumed_from, manifest = loaded.step, loaded.consumed_samples, loaded.path, loaded.manifest
    apply_hyperparameters(optimizer, config.optim)  # the config's betas/eps/wd, not the checkpoint's
    origin = start_step if plan.restart_schedule else int(manifest.get(SCHEDULE_ORIGIN_FIELD, 0))
    ctx = StepContext(config, plan, dist_env, device, start_step, _rewarmup_iters(config, plan), origin)
    set_lr(optimizer, ctx.lr(start_step + 1))
    settings = tuple(effective_settings(optimizer))
    if dist_env.rank == 0:
        reporter.started(StartReport(
            subrun=plan.subrun, start_step=start_step, resumed_from=str(resumed_from) if resumed_from else None,
            consumed_samples=cursor, optimizer=tuple(s.to_dict() for s in settings), loss_scale=scaler.scale,
            lr_scale=plan.lr_scale, clip_grad=plan.clip_grad if plan.clip_grad is not None else config.optim.clip_grad,
            reset_optimizer=plan.reset_optimizer, skip_ranges=tuple((r.start, r.end) for r in plan.skip_ranges),
            time=time.time(), layout=engine.layout.describe(), data_parallel_size=engine.layout.dp,
            accumulation_steps=config.accumulation_steps(dist_env.world_size),
        ))
    setup = Setup(stream, reporter, settings, throughput_of(config, device, dist_env))
    checkpointer = _checkpointer(config, plan, dist_env, ckpt_group, start_step, resumed_from)
    position = Position(cursor, int(manifest.get(SKIPPED_SAMPLES_FIELD, 0)))
    return Session(ctx, setup, engine, scaler, checkpointer, position)


def build_stream(config: TrainerConfig, plan: ResumePlan) -> Any:
    """The sample stream a sub-run under ``plan`` reads."""
    from trainer.data import build_sample_stream  # the data package is optional until a run starts

    return build_sample_stream(config.data, config.model.seq_length, seed=config.training.seed,
                               skip_ranges=plan.skip_ranges)


def throughput_of(config: TrainerConfig, device: Device, dist_env: DistEnv) -> Optional[Throughput]:
    """What turns tokens/s into MFU: rank 0 reports the steps, the others need none."""
    return Throughput.of(config, device, dist_env.world_size) if dist_env.rank == 0 else None


def _rewarmup_iters(config: TrainerConfig, plan: ResumePlan) -> int:
    """The plan's re-warmup; an Adam reset without one gets the config's
    warmup length, because fresh moments with the full LR diverge (unless the
    schedule restarts: its own warmup is the ramp)."""
    if plan.rewarmup_iters or not plan.reset_optimizer or plan.restart_schedule:
        return plan.rewarmup_iters
    return warmup_iters(config.optim, config.training.train_iters)


def _checkpointer(config: TrainerConfig, plan: ResumePlan, dist_env: DistEnv, ckpt_group: dist.ProcessGroup,
                  start_step: int, resumed_from: Optional[Path]) -> Optional[Checkpointer]:
    if config.checkpoint.save is None:
        return None
    save_dir = Path(config.checkpoint.save)
    if dist_env.rank == 0:
        # Checkpoints past the start belong to an abandoned branch (a rollback): not "latest" any more.
        retire_checkpoints_after(save_dir, start_step, plan.subrun)
    protect = (resumed_from,) if resumed_from is not None else ()
    return Checkpointer(save_dir, config.checkpoint, dist_env.rank, ckpt_group, protect=protect,
                        shapes=config_shapes(config.model))


def lr_schedule_of(config: TrainerConfig, plan: ResumePlan) -> dict:
    """What :data:`LR_SCHEDULE_FIELD` records for ``config`` under ``plan``."""
    optim, iters = config.optim, config.training.train_iters
    return {"max_lr": optim.lr * plan.lr_scale, "min_lr": optim.min_lr * plan.lr_scale,
            "lr_warmup_steps": warmup_iters(optim, iters), "lr_decay_steps": decay_iters(optim, iters),
            "lr_decay_style": str(optim.lr_decay_style)}


def manifest_fields(session: Session) -> dict:
    """What a checkpoint of ``session`` records in its manifest besides the weights."""
    ctx = session.ctx
    config, plan = ctx.config, ctx.plan
    return {
        "consumed_samples": session.position.cursor,
        "subrun": plan.subrun,
        "plan": plan.to_dict(),
        "config_hash": config_hash(config),
        "world_size": ctx.dist_env.world_size,
        "seed": config.training.seed,
        "rng": rng_snapshot(),
        SKIPPED_SAMPLES_FIELD: session.position.skipped_samples,
        SCHEDULE_ORIGIN_FIELD: ctx.schedule_origin,
        LR_SCHEDULE_FIELD: lr_schedule_of(config, plan),
    }
