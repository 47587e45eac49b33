"""Warm recovery where no replica holds a rank's state (ZeRO-1 and FSDP2 shards, tensor- and
pipeline-parallel parts): in-memory snapshots, each also kept by the rank's buddy
(trainer/warm.py)."""

from __future__ import annotations

import time
from typing import Mapping, Optional

import torch

from trainer import host_state
from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.parallel.engine import build_engine
from trainer.precision import embedding_dtype
from trainer.recovery.regroup import WarmRecovery
from trainer.recovery.state import capture, restore
from trainer.report import Heartbeat
from trainer.rng import seed_everything
from trainer.session import Session
from trainer.rejoin import Rejoin, WarmLink, buddy_of, buddy_source
from trainer.warm import Snapshots, agree_on_step


class SnapshotRecovery(WarmRecovery):
    """Every ``checkpoint.memory_interval`` steps each rank keeps a host snapshot and sends it to
    its buddy; when a peer dies, the re-formed group builds its model anew on a new device mesh,
    agrees on the newest snapshot it holds in common, and every rank rolls back to it, each lost
    rank's buddy sending the lost rank's copy to its replacement. For layouts that are not plain
    data parallel (that one is :class:`trainer.recovery.live.LiveRecovery`'s)."""

    def __init__(self, link: WarmLink, config: TrainerConfig, device: Device) -> None:
        super().__init__(link, config, device)
        self.snapshots = Snapshots(config.checkpoint.memory_interval)
        """This rank's snapshots and its buddy source's copies."""

    def on_start(self, session: Session) -> None:
        self._snapshot(session, session.ctx.start_step)  # a peer may die before the first step's snapshot

    def after_step(self, session: Session, step: int) -> None:
        if self.snapshots.due(step):
            session.setup.reporter.heartbeat(Heartbeat(session.ctx.dist_env.rank, "snapshot", step, time.time()))
            self._snapshot(session, step)

    def newest_step(self) -> Optional[int]:
        return self.snapshots.steps[-1] if self.snapshots.steps else None

    def _resume(self, session: Session, rejoin: Rejoin) -> int:
        env = rejoin.dist_env
        _build_engine_anew(session, env.rank)
        step = agree_on_step(self.snapshots, rejoin.donors, env.world_size, session.ctx.device.torch_device,
                             rejoin.at_most, from_buddies=True)
        self._donate(session, rejoin.donors, env.rank, step)
        restore(session, self.snapshots.get(step))
        self.snapshots.keep_only(step)
        return step

    def _resumed(self, session: Session, rejoin: Rejoin, step: int) -> None:
        self._exchange_with_buddies(session, step)  # the replacements hold no buddy copy yet

    def spare_source(self, rejoin: Rejoin, device: torch.device) -> tuple[int, int]:
        env = rejoin.dist_env
        step = agree_on_step(None, rejoin.donors, env.world_size, device, rejoin.at_most, from_buddies=True)
        return step, rejoin.donors[env.rank]

    def spare_joined(self, session: Session, rejoin: Rejoin, step: int, state: dict) -> None:
        self._snapshot(session, step)

    def _snapshot(self, session: Session, step: int) -> None:
        """Keep this rank's snapshot of ``step``, send it to this rank's buddy and keep the copy
        of the rank it is the buddy of."""
        self.snapshots.take(step, capture(session))
        self._exchange_with_buddies(session, step)

    def _exchange_with_buddies(self, session: Session, step: int) -> None:
        """Every rank sends its snapshot of ``step`` to its buddy and keeps its source's (none in
        a group of one rank)."""
        rank, layout, offset = session.ctx.dist_env.rank, session.engine.layout, self.link.buddy_offset
        buddy, source = buddy_of(rank, layout, offset), buddy_source(rank, layout, offset)
        if buddy is None or source is None:
            return
        received, _extra = host_state.exchange(self.snapshots.own(step), buddy, source, self.host_group,
                                               reuse=self.snapshots.recycle_buddy())
        self.snapshots.keep_buddy(step, received)

    def _donate(self, session: Session, donors: Mapping[int, int], rank: int, step: int) -> None:
        """Send the buddy copy of ``step`` to each replaced rank this rank is the donor of, with
        the losses so far (a snapshot holds only their count)."""
        for replaced, donor in sorted(donors.items()):
            if donor == rank:
                held = self.snapshots.buddy(step)
                count = int(held.skeleton["losses_count"])
                host_state.send(held, replaced, self.host_group, extra={"losses": session.losses[:count]})


def _build_engine_anew(session: Session, rank: int) -> None:
    """This rank's model and optimizer built on the re-formed group's mesh; the snapshot then fills them."""
    config = session.ctx.config
    seed_everything(config.training.seed)
    session.engine = build_engine(config, session.ctx.layout, rank, session.ctx.device,
                                  embedding_dtype(config.precision))
