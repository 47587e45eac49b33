"""A ready spare: it pays what it can while it waits, then takes the place the driver names
in a re-formed group and receives that rank's state from its donor; the loop trains on
with it (trainer/loop.py's ``train_spare``)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from trainer import host_state
from trainer.config import TrainerConfig
from trainer.device import Device, resolve_device
from trainer.distributed import DistEnv, destroy_process_groups, init_process_groups
from trainer.model import build_model
from trainer.optim import build_optimizer, effective_settings
from trainer.parallel.engine import Engine, build_engine, plain_engine
from trainer.plan import ResumePlan
from trainer.precision import LossScaler, embedding_dtype
from trainer.recovery.factory import warm_recovery
from trainer.recovery.regroup import WarmRecovery, rejoined_checkpointer
from trainer.recovery.state import restore
from trainer.report import Heartbeat, Reporter
from trainer.rng import seed_everything
from trainer.session import Position, Session, Setup, build_stream, throughput_of
from trainer.steps import StepContext
from trainer.rejoin import WarmLink


@dataclass(frozen=True)
class Joined:
    """A spare in the re-formed group, standing where the rank it replaces would."""

    session: Session
    recovery: WarmRecovery
    """Its recovery from now on, as any rank's."""
    step: int
    """The step its state stands at: it trains the next one."""


@contextmanager
def joined_as_spare(config: TrainerConfig, reporter: Reporter, link: WarmLink) -> Iterator[Joined]:
    """Pay the first step's imports now (and in plain data parallel build the model and
    optimizer), then wait for the driver to name the rank this spare replaces; join the
    re-formed group, receive that rank's state from its donor. The process groups end with
    the context."""
    device = resolve_device(config.device, 0, config.training.deterministic)
    plain = config.layout(config.model_parallel_size).plain
    prebuilt = _prebuilt(config, device) if plain else None
    _import_optimizer_step(config)
    rejoin = link.join()
    env = rejoin.dist_env
    reporter.heartbeat(Heartbeat(env.rank, "init", 0, time.time()))
    ckpt_group = init_process_groups(env, device.backend, config.parallel.dist_timeout_s)
    try:
        recovery = warm_recovery(link, config, device, plain)
        engine = plain_engine(*prebuilt, device, env.rank, env.world_size) if prebuilt is not None \
            else _built_engine(config, env, device)
        step, donor = recovery.spare_source(rejoin, device.torch_device)
        received, extra = host_state.receive(donor, recovery.host_group)
        state = {**received.unpack(), **extra}
        session = _spare_session(config, rejoin.plan, env, device, engine, state, reporter)
        restore(session, state)
        session.checkpointer = rejoined_checkpointer(session.ctx, ckpt_group)
        recovery.spare_joined(session, rejoin, step, state)
        yield Joined(session, recovery, step)
    finally:
        destroy_process_groups()


def _prebuilt(config: TrainerConfig, device: Device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A plain data-parallel replica's model and optimizer, built while the spare waits."""
    model = build_model(config.model, embedding_dtype(config.precision)).to(device.torch_device)
    return model, build_optimizer(model, config.optim)


def _built_engine(config: TrainerConfig, env: DistEnv, device: Device) -> Engine:
    """The spare's share of the model and optimizer on the re-formed group's mesh (outside plain
    data parallel: the mesh does not exist before); its donor's state then fills it."""
    seed_everything(config.training.seed)
    return build_engine(config, config.layout(env.world_size), env.rank, device, embedding_dtype(config.precision))


def _import_optimizer_step(config: TrainerConfig) -> None:
    """The first ``step`` of an optimizer in a fresh process imports torch._dynamo (~1 s here):
    a spare pays it while it waits, on a throwaway parameter."""
    throwaway = torch.nn.Linear(1, 1)
    for param in throwaway.parameters():
        param.grad = torch.zeros_like(param)
    build_optimizer(throwaway, config.optim).step()  # the same optimizer class and options


def _spare_session(config: TrainerConfig, plan: ResumePlan, env: DistEnv, device: Device, engine: Engine,
                   state: dict, reporter: Reporter) -> Session:
    """The spare's session under the donor's sub-run context; :func:`restore` then fills its state."""
    ctx = StepContext(config, plan, env, device, int(state["start_step"]), int(state["rewarmup_iters"]),
                      int(state["schedule_origin"]))
    setup = Setup(build_stream(config, plan), reporter, tuple(effective_settings(engine.optimizer)),
                  throughput_of(config, device, env))
    return Session(ctx, setup, engine, LossScaler.from_config(config.precision), None, Position(0))
