"""The training loop: ``train(config, plan, reporter, dist_env)``.

One call runs one sub-run on one rank: start the process groups, build (or
resume) the model and optimizer, apply the resume plan, then take optimizer
steps until ``training.train_iters``, reporting each step and checkpointing
every ``save_interval``. A step that fails goes to the rank's recovery
(trainer/recovery/hooks.py): by default there is none, and the fault (a lost
peer surfaces as a gloo RuntimeError) propagates to the caller, which decides
what to do.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional

import torch

from trainer.checkpoint import SavedCheckpoint
from trainer.config import TrainerConfig
from trainer.device import resolve_device
from trainer.distributed import DistEnv, destroy_process_groups, gather_floats, gather_ints, init_process_groups
from trainer.errors import TrainerConfigError
from trainer.memory import HeldMemory, held_memory
from trainer.optim import GroupSettings
from trainer.parallel.footprint import optimizer_state_bytes
from trainer.plan import ResumePlan
from trainer.recovery import Recovery, RecoveryFactory, joined_as_spare, recovery_for
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, Reporter, StartReport, StepReport
from trainer.rng import reseed_for_step
from trainer.session import Session, manifest_fields, start_session
from trainer.steps import forward_backward, micro_batches, optimizer_step
from trainer.rejoin import WarmLink


@dataclass(frozen=True)
class TrainResult:
    """What one call of :func:`train` did (identical on every rank unless noted)."""

    start_step: int
    """Step the run started from (0, or the checkpoint's step)."""
    step: int
    """Steps completed at the end (== training.train_iters)."""
    consumed_samples: int
    """Stream position at the end."""
    losses: tuple[float, ...]
    """Global-batch loss of every step this call ran, in order."""
    optimizer_at_start: tuple[GroupSettings, ...]
    """Optimizer settings in force for the first step, after load and plan."""
    last_checkpoint: Optional[str]
    """Newest checkpoint this call completed (rank 0; None on other ranks)."""
    memory: Optional[HeldMemory] = None
    """What this rank held at the end, measured (its own figures, per rank)."""

    def to_dict(self) -> dict:
        """Plain data (JSON-ready), e.g. for a Ray actor to return."""
        out = asdict(self)
        out["memory"] = self.memory.to_dict() if self.memory else None
        out["optimizer_at_start"] = [group.to_dict() for group in self.optimizer_at_start]
        out["losses"] = list(self.losses)
        return out


class NullReporter:
    """Drops every report (tests, or callers that only want the result)."""

    def started(self, report: StartReport) -> None: ...

    def step(self, report: StepReport) -> None: ...

    def checkpoint(self, report: CheckpointReport) -> None: ...

    def local_norms(self, report: LocalNormsReport) -> None: ...

    def heartbeat(self, beat: Heartbeat) -> None: ...


def check_config(config: TrainerConfig, world_size: int) -> None:
    """Raise :class:`TrainerConfigError` with the first problem, if any: an
    inconsistency, or a setting this trainer cannot execute."""
    unsupported = config.unsupported()
    problems = ([unsupported] if unsupported else []) + config.problems(world_size)
    if problems:
        raise TrainerConfigError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def _limit_threads() -> None:
    # Ranks share the machine's cores; oversubscription makes every rank slower.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def train(
    config: TrainerConfig,
    plan: ResumePlan = ResumePlan(),
    reporter: Optional[Reporter] = None,
    dist_env: Optional[DistEnv] = None,
    warm: Optional[WarmLink] = None,
    *,
    recovery: Optional[RecoveryFactory] = None,
) -> TrainResult:
    """Run (or resume) training on this rank until ``training.train_iters``. With ``warm``
    and ``checkpoint.memory_interval``, a peer's death is survived in this process
    (trainer/recovery); without, it propagates. ``recovery`` replaces what ``warm`` asks for
    with a recovery of the caller's (a test's fake)."""
    if warm is not None and recovery is not None:
        raise TypeError("train() takes warm or recovery, not both")
    dist_env = dist_env or DistEnv.from_environ()
    reporter = reporter or NullReporter()
    check_config(config, dist_env.world_size)
    plan_problems = plan.problems(config.layout(dist_env.world_size))
    if plan_problems:
        raise TrainerConfigError(plan_problems[0])
    _limit_threads()
    reporter.heartbeat(Heartbeat(dist_env.rank, "init", 0, time.time()))
    device = resolve_device(config.device, dist_env.local_rank, config.training.deterministic)
    baseline = device.memory_in_use_bytes()  # before the process groups, the model and the data
    ckpt_group = init_process_groups(dist_env, device.backend, config.parallel.dist_timeout_s)
    try:
        # Right after the process groups, before the model: a recovery may make a group of its own.
        rank_recovery = (recovery or recovery_for(warm))(config, device, dist_env)
        session = start_session(config, plan, reporter, dist_env, device, ckpt_group)
        rank_recovery.on_start(session)
        return _run(session, session.ctx.start_step + 1, rank_recovery, baseline)
    finally:
        destroy_process_groups()


def train_spare(config: TrainerConfig, reporter: Reporter, warm: WarmLink) -> TrainResult:
    """A ready spare: wait for the driver to name the rank it replaces, join the re-formed group
    with that rank's state (trainer/recovery/spare.py), and train on as it would have."""
    _limit_threads()
    with joined_as_spare(config, reporter, warm) as joined:
        return _run(joined.session, joined.step + 1, joined.recovery)


def _run(session: Session, first_step: int, recovery: Recovery, baseline_memory: int = 0) -> TrainResult:
    """Train from ``first_step`` to the end. A step that fails goes to ``recovery``: it resumes
    the session at a step and the loop goes on after it, or the error goes on."""
    end_step = max(session.ctx.start_step, session.ctx.config.training.train_iters)
    step = first_step
    while step <= end_step:
        try:
            _train_step(session, step, recovery)
            recovery.after_step(session, step)
        except RuntimeError as error:
            resumed = recovery.on_failure(session, error)
            if resumed is None:
                raise
            step = resumed + 1
            continue
        step += 1
    return _finish(session, end_step, baseline_memory)


def _finish(session: Session, end_step: int, baseline_memory: int) -> TrainResult:
    """Commit the save still in flight, and say what this call did."""
    rank = session.ctx.dist_env.rank
    if session.checkpointer is not None:
        session.setup.reporter.heartbeat(Heartbeat(rank, "checkpoint", end_step, time.time()))
        _report_saved(session, [session.checkpointer.wait()])
    memory = held_memory(session.engine.model, session.engine.optimizer, session.ctx.device.peak_memory_bytes(),
                         baseline_memory)
    return TrainResult(session.ctx.start_step, end_step, session.position.cursor, tuple(session.losses),
                       session.setup.optimizer_at_start, session.last_checkpoint if rank == 0 else None, memory)


def _train_step(session: Session, step: int, recovery: Recovery) -> None:
    ctx = session.ctx
    session.setup.reporter.heartbeat(Heartbeat(ctx.dist_env.rank, "step", step, time.time()))
    if step in ctx.plan.skip_iterations:
        _skip_step(session)
        recovery.on_commit(session, step, None)  # a dummy iteration has no collective: committed at once
    else:
        _run_step(session, step, recovery)
    _checkpoint_phase(session, step)


def _skip_step(session: Session) -> None:
    """A dummy iteration (Megatron's --iterations-to-skip): consume one global
    batch without training on it, so later steps see the data they would have."""
    batch = session.ctx.config.training.global_batch_size
    _positions, cursor = session.setup.stream.take(session.position.cursor, batch)
    session.position = replace(session.position, cursor=cursor,
                               skipped_samples=session.position.skipped_samples + batch)


@dataclass(frozen=True)
class _Measured:
    """What a step measured, for its report."""

    loss: float
    grad_norm: float
    loss_scale: float
    """The scale the step ran with (its update may have changed it since)."""
    skipped: bool
    gathered: list[list[float]]
    """Every rank's row of the step's gather: loss, compute time, holds a loss, peak MiB and rest."""
    started: float
    """perf_counter at the step's start."""


def _run_step(session: Session, step: int, recovery: Recovery) -> None:
    """Train ``step`` and report it (rank 0). Every collective of the step comes before the
    update: from the update on, all is local, so a peer's death leaves this rank's state
    committed at this step or the one before (trainer/live.py)."""
    ctx, scaler = session.ctx, session.scaler
    config, rank, world = ctx.config, ctx.dist_env.rank, ctx.dist_env.world_size
    started = time.perf_counter()
    # The ranks of a tensor-parallel group draw the same dropout masks: their activations are replicas.
    reseed_for_step(config.training.seed, step, ctx.layout.seed_rank(rank))
    batches, cursor = micro_batches(session.setup.stream, session.position.cursor, ctx)
    session.position = replace(session.position, cursor=cursor)
    loss_scale = scaler.scale  # the scale this step ran with; the update may change it
    local_loss, compute_time = forward_backward(session.engine, batches, loss_scale, ctx)
    holds = local_loss is not None and session.engine.reports_loss
    # Peak bytes as whole MiB and the rest: each part exact in the float32 the gather carries.
    peak_mib, peak_rest = divmod(ctx.device.peak_memory_bytes(), 1 << 20)
    gathered = gather_floats([local_loss if holds else 0.0, compute_time, float(holds), peak_mib, peak_rest],
                             world, ctx.device.torch_device)
    # The mean over the ranks that computed a loss (the last pipeline stage, one rank per
    # tensor-parallel group), in rank order: the same float on every rank.
    losses = [row[0] for row in gathered if row[2]]
    loss = sum(losses) / len(losses)
    before_clip = _norms_reporter(session, step) if norms_due(config, ctx.plan, step) else None
    grad_norm, skipped = optimizer_step(session.engine, scaler, ctx.lr(step), ctx, before_clip)
    if not session.optimizer_bytes and not skipped:
        session.optimizer_bytes = _optimizer_bytes(session)
    session.losses.append(loss)
    report = None
    if (rank == 0 or recovery.keeps_reports) and log_due(config, step):
        report = _step_report(session, step, _Measured(loss, grad_norm, loss_scale, skipped, gathered, started))
    recovery.on_commit(session, step, report)
    if rank == 0 and report is not None:
        session.setup.reporter.step(report)


def log_due(config: TrainerConfig, step: int) -> bool:
    """Whether ``step`` is reported: every ``training.log_interval``-th step and the last."""
    return step % config.training.log_interval == 0 or step == config.training.train_iters


def _step_report(session: Session, step: int, measured: _Measured) -> StepReport:
    ctx, config = session.ctx, session.ctx.config
    tokens, step_time = config.training.global_batch_size * config.model.seq_length, \
        time.perf_counter() - measured.started
    tokens_per_s = tokens / step_time if step_time > 0 else 0.0
    throughput, gathered = session.setup.throughput, measured.gathered
    return StepReport(
        subrun=ctx.plan.subrun, step=step, loss=measured.loss, grad_norm=measured.grad_norm, lr=ctx.lr(step),
        loss_scale=measured.loss_scale, tokens=tokens, consumed_samples=session.position.cursor,
        step_time=step_time, compute_times=tuple(row[1] for row in gathered), skipped=measured.skipped,
        time=time.time(), skipped_samples=session.position.skipped_samples, tokens_per_s=tokens_per_s,
        mfu=throughput.mfu(tokens_per_s) if throughput else None,
        peak_memory_bytes=tuple(int(row[3]) * (1 << 20) + int(row[4]) for row in gathered),
        optimizer_state_bytes=session.optimizer_bytes,
    )


def _optimizer_bytes(session: Session) -> tuple[int, ...]:
    """Each rank's optimizer-state bytes, after the first update: in plain data parallel every
    replica holds the same (no collective after the update: see :func:`_run_step`)."""
    ctx, optimizer = session.ctx, session.engine.optimizer
    if session.engine.layout.plain:
        return (optimizer_state_bytes(optimizer),) * ctx.dist_env.world_size
    return tuple(gather_ints(optimizer_state_bytes(optimizer), ctx.dist_env.world_size, ctx.device.torch_device))


def norms_due(config: TrainerConfig, plan: ResumePlan, step: int) -> bool:
    """Whether ``step`` reports its local norms: every ``training.local_norms_interval``-th
    step (0: none) and the steps the plan asks for."""
    interval = config.training.local_norms_interval
    return (interval > 0 and step % interval == 0) or step in plan.local_norms_steps


def _norms_reporter(session: Session, step: int) -> Callable[[], None]:
    """What the update calls once the gradients are averaged and unscaled, before
    clipping (on every rank: the norms of a split model are a collective; rank 0 reports)."""
    def report() -> None:
        norms = session.engine.local_norms()
        if session.ctx.dist_env.rank == 0:
            session.setup.reporter.local_norms(LocalNormsReport(session.ctx.plan.subrun, step, norms, time.time()))
    return report


def _report_saved(session: Session, saved: list[Optional[SavedCheckpoint]]) -> None:
    for item in saved:
        if item is not None:
            session.last_checkpoint = str(item.path)
            session.setup.reporter.checkpoint(
                CheckpointReport(session.ctx.plan.subrun, item.step, str(item.path), item.seconds, time.time()))


def save_due(config: TrainerConfig, step: int) -> bool:
    """Whether the loop starts a checkpoint after ``step``."""
    return step % config.checkpoint.save_interval == 0 or step == config.training.train_iters


def _checkpoint_phase(session: Session, step: int) -> None:
    """Commit a finished background save; start a new one when due. Every
    commit and every save is announced by a ``checkpoint`` beat first: whoever
    runs the trainer may stop the rank there (runmgr's worker does when its
    driver is gone), so that nothing more is written or committed."""
    checkpointer, ctx, reporter = session.checkpointer, session.ctx, session.setup.reporter
    if checkpointer is None:
        return
    if checkpointer.written:
        if ctx.dist_env.rank == 0:  # rank 0 alone commits (writes the manifest)
            reporter.heartbeat(Heartbeat(ctx.dist_env.rank, "checkpoint", step, time.time()))
        _report_saved(session, [checkpointer.wait()])
    if not save_due(ctx.config, step):
        return
    reporter.heartbeat(Heartbeat(ctx.dist_env.rank, "checkpoint", step, time.time()))
    fields = manifest_fields(session)
    _report_saved(session, checkpointer.save(step, session.engine.model, session.engine.optimizer, session.scaler,
                                             session.position.cursor, fields))
