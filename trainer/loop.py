"""The training loop: ``train(config, plan, reporter, dist_env)``.

One call runs one sub-run on one rank: start the process groups, build (or
resume) the model and optimizer, apply the resume plan, then take optimizer
steps until ``training.train_iters``, reporting each step and checkpointing
every ``save_interval``. Faults (a lost peer surfaces as a gloo RuntimeError)
propagate to the caller, which decides what to do.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from trainer.checkpoint import (
    Checkpointer,
    SavedCheckpoint,
    config_hash,
    config_shapes,
    load_checkpoint,
    retire_checkpoints_after,
)
from trainer.config import TrainerConfig
from trainer.device import Device, resolve_device
from trainer.distributed import DistEnv, destroy_process_groups, gather_floats, gather_ints, init_process_groups
from trainer.errors import TrainerConfigError
from trainer.flops import Throughput
from trainer.memory import HeldMemory, held_memory
from trainer.optim import (
    GroupSettings,
    apply_hyperparameters,
    decay_iters,
    effective_settings,
    set_lr,
    warmup_iters,
)
from trainer.model import build_model
from trainer.optim import build_optimizer
from trainer.parallel.engine import Engine, build_engine, plain_engine
from trainer.parallel.layout import Layout
from trainer.parallel.mesh import release_groups
from trainer.parallel.footprint import optimizer_state_bytes
from trainer.plan import ResumePlan
from trainer.precision import LossScaler, embedding_dtype
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, Reporter, StartReport, StepReport
from trainer.rng import reseed_for_step, rng_snapshot, seed_everything
from trainer.steps import StepContext, forward_backward, micro_batches, optimizer_step
from trainer import host_state
from trainer.live import Committed, agree_on_live_step
from trainer.warm import Snapshots, WarmLink, agree_on_step, buddy_of, buddy_source, is_peer_failure


SCHEDULE_ORIGIN_FIELD = "schedule_origin"
"""Manifest field: the step at which the LR schedule (re)started (0, or where a
``restart_schedule`` plan began); absent in older checkpoints means 0."""
SKIPPED_SAMPLES_FIELD = "skipped_samples"
"""Manifest field: samples of dummy iterations so far (absent: 0)."""
LR_SCHEDULE_FIELD = "lr_schedule"
"""Manifest field: the schedule the checkpoint was trained with, as Megatron's
scheduler state names it (max_lr and min_lr effective, i.e. times the plan's lr_scale)."""


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
) -> TrainResult:
    """Run (or resume) training on this rank until ``training.train_iters``. With ``warm``
    and ``checkpoint.memory_interval``, a peer's death is survived in this process
    (trainer/warm.py); without, it propagates."""
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
        keeper = _WarmKeeper(warm, Snapshots(config.checkpoint.memory_interval), _host_group(config, device),
                             config.layout(dist_env.world_size).plain) \
            if warm is not None and config.checkpoint.memory_interval else None
        return _train(config, plan, reporter, dist_env, device, ckpt_group, baseline, keeper)
    finally:
        destroy_process_groups()


@dataclass
class _WarmKeeper:
    """A rank's warm state: its link to the driver, its snapshots, and the group they travel on."""

    link: WarmLink
    snapshots: Snapshots
    host_group: Optional[dist.ProcessGroup]
    """Where snapshots go between ranks: a gloo group of host tensors (None: the default group,
    when it is gloo already)."""
    live: bool = False
    """Plain data parallel: the replicas' live state serves, no snapshot is taken (trainer/live.py)."""


def _host_group(config: TrainerConfig, device: Device) -> Optional[dist.ProcessGroup]:
    """The group host-memory snapshots travel on. Every rank creates it at the same point (right
    after the process groups, before any device mesh): groups are made in the same order everywhere."""
    if device.backend == "gloo":
        return None
    from datetime import timedelta

    return dist.new_group(backend="gloo", timeout=timedelta(seconds=config.parallel.dist_timeout_s))


def _rewarmup_iters(config: TrainerConfig, plan: ResumePlan) -> int:
    """The plan's re-warmup; an Adam reset without one gets the config's
    warmup length, because fresh moments with the full LR diverge (unless the
    schedule restarts: its own warmup is the ramp)."""
    if plan.rewarmup_iters or not plan.reset_optimizer or plan.restart_schedule:
        return plan.rewarmup_iters
    return warmup_iters(config.optim, config.training.train_iters)


@dataclass
class _Session:
    """What one sub-run holds on this rank between steps."""

    ctx: StepContext
    stream: Any
    engine: Engine
    """This rank's share of the model and optimizer."""
    scaler: LossScaler
    checkpointer: Optional[Checkpointer]
    reporter: Reporter
    cursor: int
    optimizer_at_start: tuple[GroupSettings, ...]
    skipped_samples: int = 0
    """Samples of dummy iterations (plan.skip_iterations), over the lineage."""
    losses: list[float] = field(default_factory=list)
    last_checkpoint: Optional[str] = None
    throughput: Optional[Throughput] = None
    """How a step's tokens/s becomes MFU (rank 0 only)."""
    optimizer_bytes: tuple[int, ...] = ()
    """Each rank's optimizer-state bytes, measured once after the first update."""
    committed: Optional[Committed] = None
    """Where this rank's live state stands, when it serves as the warm copy (trainer/live.py)."""


def _start(config: TrainerConfig, plan: ResumePlan, reporter: Reporter, dist_env: DistEnv, device: Device,
           ckpt_group) -> _Session:
    """Build the model and optimizer, load the plan's checkpoint, apply the plan."""
    from trainer.data import build_sample_stream  # the data package is optional until a run starts

    # Data first: a bad data path should fail before anything expensive.
    stream = build_sample_stream(config.data, config.model.seq_length, seed=config.training.seed,
                                 skip_ranges=plan.skip_ranges)
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
    throughput = Throughput.of(config, device, dist_env.world_size) if dist_env.rank == 0 else None
    return _Session(ctx, stream, engine, scaler,
                    _checkpointer(config, plan, dist_env, ckpt_group, start_step, resumed_from), reporter, cursor,
                    settings, int(manifest.get(SKIPPED_SAMPLES_FIELD, 0)), throughput=throughput)


def _skip_step(session: _Session) -> None:
    """A dummy iteration (Megatron's --iterations-to-skip): consume one global
    batch without training on it, so later steps see the data they would have."""
    batch = session.ctx.config.training.global_batch_size
    _positions, session.cursor = session.stream.take(session.cursor, batch)
    session.skipped_samples += batch


def _run_step(session: _Session, step: int) -> None:
    """Train ``step`` and report it (rank 0). Every collective of the step comes before the
    update: from the update on, all is local, so a peer's death leaves this rank's state
    committed at this step or the one before (trainer/live.py)."""
    ctx, scaler = session.ctx, session.scaler
    config, rank, world = ctx.config, ctx.dist_env.rank, ctx.dist_env.world_size
    started = time.perf_counter()
    # The ranks of a tensor-parallel group draw the same dropout masks: their activations are replicas.
    reseed_for_step(config.training.seed, step, ctx.layout.seed_rank(rank))
    batches, session.cursor = micro_batches(session.stream, session.cursor, ctx)
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
    if (rank == 0 or session.committed is not None) and (
            step % config.training.log_interval == 0 or step == config.training.train_iters):
        tokens, step_time = config.training.global_batch_size * config.model.seq_length, time.perf_counter() - started
        tokens_per_s = tokens / step_time if step_time > 0 else 0.0
        report = StepReport(
            subrun=ctx.plan.subrun, step=step, loss=loss, grad_norm=grad_norm, lr=ctx.lr(step),
            loss_scale=loss_scale, tokens=tokens, consumed_samples=session.cursor, step_time=step_time,
            compute_times=tuple(row[1] for row in gathered), skipped=skipped, time=time.time(),
            skipped_samples=session.skipped_samples, tokens_per_s=tokens_per_s,
            mfu=session.throughput.mfu(tokens_per_s) if session.throughput else None,
            peak_memory_bytes=tuple(int(row[3]) * (1 << 20) + int(row[4]) for row in gathered),
            optimizer_state_bytes=session.optimizer_bytes,
        )
    if session.committed is not None:
        session.committed.commit(step, session.cursor, session.skipped_samples, report)
    if rank == 0 and report is not None:
        session.reporter.step(report)


def _optimizer_bytes(session: _Session) -> tuple[int, ...]:
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


def _norms_reporter(session: _Session, step: int) -> Callable[[], None]:
    """What the update calls once the gradients are averaged and unscaled, before
    clipping (on every rank: the norms of a split model are a collective; rank 0 reports)."""
    def report() -> None:
        norms = session.engine.local_norms()
        if session.ctx.dist_env.rank == 0:
                session.reporter.local_norms(LocalNormsReport(session.ctx.plan.subrun, step, norms, time.time()))
    return report


def _report_saved(session: _Session, saved: list[Optional[SavedCheckpoint]]) -> None:
    for item in saved:
        if item is not None:
            session.last_checkpoint = str(item.path)
            session.reporter.checkpoint(
                CheckpointReport(session.ctx.plan.subrun, item.step, str(item.path), item.seconds, time.time()))


def _checkpoint_phase(session: _Session, step: int) -> None:
    """Commit a finished background save; start a new one when due. Every
    commit and every save is announced by a ``checkpoint`` beat first: whoever
    runs the trainer may stop the rank there (runmgr's worker does when its
    driver is gone), so that nothing more is written or committed."""
    checkpointer, ctx = session.checkpointer, session.ctx
    if checkpointer is None:
        return
    if checkpointer.written:
        if ctx.dist_env.rank == 0:  # rank 0 alone commits (writes the manifest)
            session.reporter.heartbeat(Heartbeat(ctx.dist_env.rank, "checkpoint", step, time.time()))
        _report_saved(session, [checkpointer.wait()])
    if not save_due(ctx.config, step):
        return
    session.reporter.heartbeat(Heartbeat(ctx.dist_env.rank, "checkpoint", step, time.time()))
    fields = _manifest_fields(session)
    _report_saved(session, checkpointer.save(step, session.engine.model, session.engine.optimizer, session.scaler,
                                             session.cursor, fields))


def _train(config: TrainerConfig, plan: ResumePlan, reporter: Reporter, dist_env: DistEnv,
           device: Device, ckpt_group, baseline_memory: int = 0, warm: Optional[_WarmKeeper] = None) -> TrainResult:
    session = _start(config, plan, reporter, dist_env, device, ckpt_group)
    if warm is not None and warm.live:
        session.committed = Committed(session.ctx.start_step, session.cursor, session.skipped_samples)
    elif warm is not None:  # a peer may die before the first step's snapshot
        _snapshot(session, warm, session.ctx.start_step)
    return _run(session, session.ctx.start_step + 1, baseline_memory, warm)


def _run(session: _Session, first_step: int, baseline_memory: int, warm: Optional[_WarmKeeper]) -> TrainResult:
    """Train from ``first_step`` to the end; a peer's death re-forms the group when ``warm``."""
    config = session.ctx.config
    end_step = max(session.ctx.start_step, config.training.train_iters)
    step = first_step
    while step <= end_step:
        try:
            _train_step(session, step)
            if warm is not None and not warm.live and warm.snapshots.due(step):
                session.reporter.heartbeat(Heartbeat(session.ctx.dist_env.rank, "snapshot", step, time.time()))
                _snapshot(session, warm, step)
        except RuntimeError as error:
            if warm is None or not is_peer_failure(error):
                raise
            step = (_rejoin_live(session, warm, error) if warm.live else _rejoin(session, warm, error)) + 1
            continue
        step += 1
    rank = session.ctx.dist_env.rank
    if session.checkpointer is not None:
        session.reporter.heartbeat(Heartbeat(rank, "checkpoint", end_step, time.time()))
        _report_saved(session, [session.checkpointer.wait()])
    memory = held_memory(session.engine.model, session.engine.optimizer, session.ctx.device.peak_memory_bytes(),
                         baseline_memory)
    return TrainResult(session.ctx.start_step, end_step, session.cursor, tuple(session.losses),
                       session.optimizer_at_start, session.last_checkpoint if rank == 0 else None, memory)


def _train_step(session: _Session, step: int) -> None:
    ctx = session.ctx
    session.reporter.heartbeat(Heartbeat(ctx.dist_env.rank, "step", step, time.time()))
    if step in ctx.plan.skip_iterations:
        _skip_step(session)
        if session.committed is not None:  # a dummy iteration has no collective: committed at once
            session.committed.commit(step, session.cursor, session.skipped_samples)
    else:
        _run_step(session, step)
    _checkpoint_phase(session, step)


def _capture(session: _Session) -> dict:
    """What a rank needs to resume at the step just completed (trainer/warm.py keeps a host copy)."""
    ctx = session.ctx
    return {"model": session.engine.model.state_dict(), "optimizer": session.engine.optimizer.state_dict(),
            "scaler": session.scaler.state_dict(), "cursor": session.cursor,
            # The count, not the list: a copy per step of every loss so far would grow with the run.
            "skipped_samples": session.skipped_samples, "losses_count": len(session.losses),
            "start_step": ctx.start_step, "rewarmup_iters": ctx.rewarmup_iters,
            "schedule_origin": ctx.schedule_origin,
            # Measured once, with a collective: a replacement must not measure it again alone.
            "optimizer_bytes": list(session.optimizer_bytes)}


def _snapshot(session: _Session, warm: _WarmKeeper, step: int) -> None:
    """Keep this rank's snapshot of ``step``; under a layout whose state is not replicated, send
    it to this rank's buddy and keep the copy of the rank it is the buddy of."""
    warm.snapshots.take(step, _capture(session))
    _exchange_with_buddies(session, warm, step)


def _exchange_with_buddies(session: _Session, warm: _WarmKeeper, step: int) -> None:
    """Every rank sends its snapshot of ``step`` to its buddy and keeps its source's (none in
    plain data parallel: every replica holds the whole state)."""
    rank, layout, offset = session.ctx.dist_env.rank, session.engine.layout, warm.link.buddy_offset
    buddy, source = buddy_of(rank, layout, offset), buddy_source(rank, layout, offset)
    if buddy is None or source is None:
        return
    received, _extra = host_state.exchange(warm.snapshots.own(step), buddy, source, warm.host_group,
                                           reuse=warm.snapshots.recycle_buddy())
    warm.snapshots.keep_buddy(step, received)


def _restore(session: _Session, state: dict) -> None:
    """Put a snapshot back (a copy: the optimizer keeps the tensors it is given)."""
    session.engine.load_local_state(state["model"], state["optimizer"])
    session.scaler.load_state_dict(state["scaler"])
    session.cursor, session.skipped_samples = int(state["cursor"]), int(state["skipped_samples"])
    if "losses" in state:  # a replacement gets its donor's
        session.losses = [float(loss) for loss in state["losses"]]
    del session.losses[int(state["losses_count"]):]
    session.optimizer_bytes = tuple(int(size) for size in state["optimizer_bytes"])


def _rejoin(session: _Session, warm: _WarmKeeper, error: RuntimeError) -> int:
    """A peer went away: re-form the group where the driver says (a new device mesh, and the model
    and optimizer built anew on it, unless in plain data parallel), agree on the newest snapshot
    the group can resume from, send it to the replacements this rank donates to, roll back to it.
    Returns its step. The driver restarting cold instead: the error goes on."""
    snapshots, layout = warm.snapshots, session.engine.layout
    _close_connections(session, error)
    rejoin = warm.link.rejoin(error, snapshots.steps[-1] if snapshots.steps else None)
    if rejoin is None:
        raise error
    env, device, config = rejoin.dist_env, session.ctx.device, session.ctx.config
    ckpt_group = init_process_groups(env, device.backend, config.parallel.dist_timeout_s)
    warm.host_group = _host_group(config, device)
    if not layout.plain:
        _build_engine_anew(session, layout, env.rank)
    step = agree_on_step(snapshots, rejoin.donors, env.world_size, device.torch_device, rejoin.at_most,
                         from_buddies=not layout.plain)
    for replaced, donor in sorted(rejoin.donors.items()):
        if donor == env.rank:
            held = snapshots.own(step) if layout.plain else snapshots.buddy(step)
            count = int(held.skeleton["losses_count"])
            host_state.send(held, replaced, warm.host_group, extra={"losses": session.losses[:count]})
    _restore(session, snapshots.get(step))
    snapshots.keep_only(step)
    session.ctx = replace(session.ctx, plan=rejoin.plan, dist_env=env)
    session.checkpointer = _rejoined_checkpointer(session.ctx, ckpt_group)
    _exchange_with_buddies(session, warm, step)  # the replacements hold no buddy copy yet
    return step


def _rejoin_live(session: _Session, warm: _WarmKeeper, error: RuntimeError) -> int:
    """A peer went away in plain data parallel: put the data position back to the committed step,
    re-form the group where the driver says, resume at the newest step a survivor holds, its
    holder sending its live state to the ranks without it (trainer/live.py). Returns the step."""
    committed = session.committed
    assert committed is not None
    session.cursor, session.skipped_samples = committed.cursor, committed.skipped_samples
    _close_connections(session, error)
    rejoin = warm.link.rejoin(error, committed.step)
    if rejoin is None:
        raise error
    env, device, config = rejoin.dist_env, session.ctx.device, session.ctx.config
    ckpt_group = init_process_groups(env, device.backend, config.parallel.dist_timeout_s)
    warm.host_group = _host_group(config, device)
    agreed = agree_on_live_step(committed.step, env.world_size, device.torch_device)
    if env.rank == agreed.donor:
        _donate_live_state(session, agreed.receivers, warm.host_group)
    elif env.rank in agreed.receivers:
        received, extra = host_state.receive(agreed.donor, warm.host_group)
        state = {**received.unpack(), **extra}
        _restore(session, state)
        _take_donor_position(committed, agreed.step, session, state)
    session.ctx = replace(session.ctx, plan=rejoin.plan, dist_env=env)
    session.checkpointer = _rejoined_checkpointer(session.ctx, ckpt_group)
    _report_again(session, rejoin.at_most)
    return agreed.step


def _take_donor_position(committed: Committed, step: int, session: _Session, state: dict) -> None:
    """A receiver's live state now stands where the donor's does, reports included."""
    committed.commit(step, session.cursor, session.skipped_samples)
    committed.reports.clear()
    committed.reports.extend(StepReport.from_dict(report) for report in state["reports"])


def _donate_live_state(session: _Session, receivers: tuple[int, ...], group: Optional[dist.ProcessGroup]) -> None:
    """Send this rank's live state (one host copy, taken now) to each of ``receivers``, with the
    losses so far and the kept step reports."""
    assert session.committed is not None
    held = host_state.take(_capture(session))
    extra = {"losses": list(session.losses), "reports": [report.to_dict() for report in session.committed.reports]}
    for receiver in receivers:
        host_state.send(held, receiver, group, extra=extra)


def _report_again(session: _Session, recorded: Optional[int]) -> None:
    """Rank 0 of the re-formed group reports, under its new sub-run, the steps after ``recorded``
    (the newest step the driver recorded) that the group resumes past."""
    assert session.committed is not None
    if session.ctx.dist_env.rank != 0:
        return
    for report in session.committed.reports_after(recorded):
        session.reporter.step(replace(report, subrun=session.ctx.plan.subrun))


def _close_connections(session: _Session, error: BaseException) -> None:
    """End this rank's process groups, so that a survivor still waiting in a collective with it
    (not with the lost rank: a pipeline neighbour, another replica) fails at once and joins the
    recovery instead of waiting out the group's timeout: gloo has no abort, and a group's
    connections close only when nothing holds the group any more. Outside plain data parallel
    the engine holds its mesh's groups (the mesh itself, FSDP2's and the pipeline's state; the
    failed step's frames too): it goes first, and is built anew on the re-formed group."""
    traceback.clear_frames(error.__traceback__)
    if not session.engine.layout.plain:
        release_groups(session.engine.mesh)
        del session.engine
        gc.collect()  # modules and their hooks hold each other: only the collector frees them
    destroy_process_groups()


def _build_engine_anew(session: _Session, layout: Layout, rank: int) -> None:
    """This rank's model and optimizer built on the re-formed group's mesh; the snapshot then fills them."""
    config = session.ctx.config
    seed_everything(config.training.seed)
    session.engine = build_engine(config, layout, rank, session.ctx.device, embedding_dtype(config.precision))


def _rejoined_checkpointer(ctx: StepContext, ckpt_group) -> Optional[Checkpointer]:
    """A checkpointer on the re-formed group; a save that was in flight on the old one is
    abandoned (its directory has no manifest: no resume uses it)."""
    if ctx.config.checkpoint.save is None:
        return None
    return Checkpointer(Path(ctx.config.checkpoint.save), ctx.config.checkpoint, ctx.dist_env.rank, ckpt_group,
                        shapes=config_shapes(ctx.config.model))


def train_spare(config: TrainerConfig, reporter: Reporter, warm: WarmLink) -> TrainResult:
    """A ready spare: pay the first step's imports now (and in plain data parallel build the
    model and optimizer), then wait for the driver to name the rank it replaces; join the
    re-formed group, receive that rank's state from its donor, and train on as it would have."""
    _limit_threads()
    device = resolve_device(config.device, 0, config.training.deterministic)
    plain = config.layout(config.model_parallel_size).plain
    prebuilt = _prebuilt(config, device) if plain else None
    _import_optimizer_step(config)
    rejoin = warm.join()
    env = rejoin.dist_env
    reporter.heartbeat(Heartbeat(env.rank, "init", 0, time.time()))
    ckpt_group = init_process_groups(env, device.backend, config.parallel.dist_timeout_s)
    try:
        keeper = _WarmKeeper(warm, Snapshots(config.checkpoint.memory_interval), _host_group(config, device), plain)
        if prebuilt is not None:
            engine = plain_engine(*prebuilt, device, env.rank, env.world_size)
        else:
            seed_everything(config.training.seed)
            engine = build_engine(config, config.layout(env.world_size), env.rank, device,
                                  embedding_dtype(config.precision))
        if plain:
            agreed = agree_on_live_step(None, env.world_size, device.torch_device)
            step, donor = agreed.step, agreed.donor
        else:
            step = agree_on_step(None, rejoin.donors, env.world_size, device.torch_device, rejoin.at_most,
                                 from_buddies=True)
            donor = rejoin.donors[env.rank]
        received, extra = host_state.receive(donor, keeper.host_group)
        state = {**received.unpack(), **extra}
        session = _spare_session(config, rejoin.plan, env, device, engine, state, reporter)
        _restore(session, state)
        session.checkpointer = _rejoined_checkpointer(session.ctx, ckpt_group)
        if plain:
            session.committed = Committed(step, session.cursor, session.skipped_samples)
            _take_donor_position(session.committed, step, session, state)
            _report_again(session, rejoin.at_most)
        else:
            _snapshot(session, keeper, step)
        return _run(session, step + 1, 0, keeper)
    finally:
        destroy_process_groups()


def _prebuilt(config: TrainerConfig, device: Device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A plain data-parallel replica's model and optimizer, built while the spare waits."""
    model = build_model(config.model, embedding_dtype(config.precision)).to(device.torch_device)
    return model, build_optimizer(model, config.optim)


def _import_optimizer_step(config: TrainerConfig) -> None:
    """The first ``step`` of an optimizer in a fresh process imports torch._dynamo (~1 s here):
    a spare pays it while it waits, on a throwaway parameter."""
    throwaway = torch.nn.Linear(1, 1)
    for param in throwaway.parameters():
        param.grad = torch.zeros_like(param)
    build_optimizer(throwaway, config.optim).step()  # the same optimizer class and options


def _spare_session(config: TrainerConfig, plan: ResumePlan, env: DistEnv, device: Device, engine: Engine,
                   state: dict, reporter: Reporter) -> _Session:
    from trainer.data import build_sample_stream

    stream = build_sample_stream(config.data, config.model.seq_length, seed=config.training.seed,
                                 skip_ranges=plan.skip_ranges)
    ctx = StepContext(config, plan, env, device, int(state["start_step"]), int(state["rewarmup_iters"]),
                      int(state["schedule_origin"]))
    throughput = Throughput.of(config, device, env.world_size) if env.rank == 0 else None
    return _Session(ctx, stream, engine, LossScaler.from_config(config.precision), None, reporter, 0,
                    tuple(effective_settings(engine.optimizer)), throughput=throughput)


def _checkpointer(config: TrainerConfig, plan: ResumePlan, dist_env: DistEnv, ckpt_group, start_step: int,
                  resumed_from: Optional[Path]) -> Optional[Checkpointer]:
    if config.checkpoint.save is None:
        return None
    save_dir = Path(config.checkpoint.save)
    if dist_env.rank == 0:
        # Checkpoints past the start belong to an abandoned branch (a rollback): not "latest" any more.
        retire_checkpoints_after(save_dir, start_step, plan.subrun)
    protect = (resumed_from,) if resumed_from is not None else ()
    return Checkpointer(save_dir, config.checkpoint, dist_env.rank, ckpt_group, protect=protect,
                        shapes=config_shapes(config.model))


def save_due(config: TrainerConfig, step: int) -> bool:
    """Whether the loop starts a checkpoint after ``step``."""
    return step % config.checkpoint.save_interval == 0 or step == config.training.train_iters


def lr_schedule_of(config: TrainerConfig, plan: ResumePlan) -> dict:
    """What :data:`LR_SCHEDULE_FIELD` records for ``config`` under ``plan``."""
    optim, iters = config.optim, config.training.train_iters
    return {"max_lr": optim.lr * plan.lr_scale, "min_lr": optim.min_lr * plan.lr_scale,
            "lr_warmup_steps": warmup_iters(optim, iters), "lr_decay_steps": decay_iters(optim, iters),
            "lr_decay_style": str(optim.lr_decay_style)}


def _manifest_fields(session: _Session) -> dict:
    ctx = session.ctx
    config, plan = ctx.config, ctx.plan
    return {
        "consumed_samples": session.cursor,
        "subrun": plan.subrun,
        "plan": plan.to_dict(),
        "config_hash": config_hash(config),
        "world_size": ctx.dist_env.world_size,
        "seed": config.training.seed,
        "rng": rng_snapshot(),
        SKIPPED_SAMPLES_FIELD: session.skipped_samples,
        SCHEDULE_ORIGIN_FIELD: ctx.schedule_origin,
        LR_SCHEDULE_FIELD: lr_schedule_of(config, plan),
    }
