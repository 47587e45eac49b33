"""Warm recovery's common part: the steps of re-forming the group in the same processes,
the same under every layout (trainer/warm.py says how warm recovery works).

What differs by layout (whose memory holds a rank's state, how the ranks agree where
to resume) is a subclass's: :class:`trainer.recovery.live.LiveRecovery` in plain data
parallel, :class:`trainer.recovery.snapshot.SnapshotRecovery` under the other layouts.
"""

from __future__ import annotations

import gc
import traceback
from abc import ABC, abstractmethod
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from trainer.checkpoint import Checkpointer, config_shapes
from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.distributed import destroy_process_groups, init_process_groups
from trainer.parallel.mesh import release_groups
from trainer.report import StepReport
from trainer.session import Session
from trainer.steps import StepContext
from trainer.rejoin import Rejoin, WarmLink
from trainer.warm import is_peer_failure


class WarmRecovery(ABC):
    """A peer's death survived in this process (a :class:`trainer.recovery.hooks.Recovery`).

    :meth:`on_failure` takes the same steps under every layout: it closes this rank's
    connections, asks the driver where the group re-forms, starts the re-formed group's
    process groups, has the subclass agree on the step to resume at and bring the state
    there (:meth:`_resume`), gives the session the new sub-run's context and checkpointer,
    and lets the subclass prepare the next step (:meth:`_resumed`)."""

    keeps_reports = False
    """See :attr:`trainer.recovery.hooks.Recovery.keeps_reports`."""

    def __init__(self, link: WarmLink, config: TrainerConfig, device: Device) -> None:
        self.link = link
        """How this rank reaches whoever drives it (runmgr's worker, or a test)."""
        self.host_group = host_group(config, device)
        """Where state travels between ranks: a gloo group of host tensors (None: the default
        group, when it is gloo already); made anew with each re-formed group."""

    def on_start(self, session: Session) -> None:
        pass

    def on_commit(self, session: Session, step: int, report: Optional[StepReport]) -> None:
        pass

    def after_step(self, session: Session, step: int) -> None:
        pass

    def on_failure(self, session: Session, error: RuntimeError) -> Optional[int]:
        """A peer went away: re-form the group where the driver says and resume it. Returns the
        step resumed at; None for any other error, or when the driver restarts cold instead."""
        if not is_peer_failure(error):
            return None
        newest = self.newest_step()
        close_connections(session, error)
        rejoin = self.link.rejoin(error, newest)
        if rejoin is None:
            return None
        config, device = session.ctx.config, session.ctx.device
        ckpt_group = init_process_groups(rejoin.dist_env, device.backend, config.parallel.dist_timeout_s)
        self.host_group = host_group(config, device)
        step = self._resume(session, rejoin)
        session.ctx = replace(session.ctx, plan=rejoin.plan, dist_env=rejoin.dist_env)
        session.checkpointer = rejoined_checkpointer(session.ctx, ckpt_group)
        self._resumed(session, rejoin, step)
        return step

    @abstractmethod
    def newest_step(self) -> Optional[int]:
        """The newest step this rank could resume at (None: none), for the driver."""

    @abstractmethod
    def _resume(self, session: Session, rejoin: Rejoin) -> int:
        """On the re-formed group: agree on the step to resume at, send this rank's state to
        the ranks it donates to (or receive its own), put the session there; the step."""

    @abstractmethod
    def _resumed(self, session: Session, rejoin: Rejoin, step: int) -> None:
        """The session stands at ``step`` under the new sub-run: what comes before the next step."""

    @abstractmethod
    def spare_source(self, rejoin: Rejoin, device: torch.device) -> tuple[int, int]:
        """On a spare joining the re-formed group: the step it resumes at and the rank that
        sends it its state (agreed with the survivors, a collective)."""

    @abstractmethod
    def spare_joined(self, session: Session, rejoin: Rejoin, step: int, state: dict) -> None:
        """A spare's session stands at ``step`` with its donor's ``state``: what comes before its next step."""


def host_group(config: TrainerConfig, device: Device) -> Optional[dist.ProcessGroup]:
    """The group host-memory state travels on. Every rank creates it at the same point (right
    after the process groups, before any device mesh): groups are made in the same order everywhere."""
    if device.backend == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=config.parallel.dist_timeout_s))


def close_connections(session: Session, error: BaseException) -> None:
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


def rejoined_checkpointer(ctx: StepContext, ckpt_group: dist.ProcessGroup) -> Optional[Checkpointer]:
    """A checkpointer on the re-formed group; a save that was in flight on the old one is
    abandoned (its directory has no manifest: no resume uses it)."""
    if ctx.config.checkpoint.save is None:
        return None
    return Checkpointer(Path(ctx.config.checkpoint.save), ctx.config.checkpoint, ctx.dist_env.rank, ckpt_group,
                        shapes=config_shapes(ctx.config.model))
