"""Which recovery a rank gets: warm recovery when it has a link to its driver and
``checkpoint.memory_interval`` is set (the kind its layout allows), none otherwise."""

from __future__ import annotations

from typing import Optional

from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.distributed import DistEnv
from trainer.recovery.hooks import NoRecovery, Recovery, RecoveryFactory
from trainer.recovery.live import LiveRecovery
from trainer.recovery.regroup import WarmRecovery
from trainer.recovery.snapshot import SnapshotRecovery
from trainer.rejoin import WarmLink


def warm_recovery(link: WarmLink, config: TrainerConfig, device: Device, plain: bool) -> WarmRecovery:
    """In plain data parallel (``plain``) every replica's live state serves; under any other
    layout a rank's state is its own, and snapshots with buddies keep it."""
    return LiveRecovery(link, config, device) if plain else SnapshotRecovery(link, config, device)


def recovery_for(link: Optional[WarmLink]) -> RecoveryFactory:
    """What ``trainer.train``'s ``warm`` argument asks for."""
    def build(config: TrainerConfig, device: Device, dist_env: DistEnv) -> Recovery:
        if link is None or not config.checkpoint.memory_interval:
            return NoRecovery()
        return warm_recovery(link, config, device, config.layout(dist_env.world_size).plain)
    return build
