"""Who a rank is among the ranks and where they meet: plain data, read by the ranks (from
torchrun's variables) and by whoever drives them. Apart from trainer/distributed.py, whose
process groups import torch, so that a driver that only names a rank's place (a warm
recovery's answer, trainer/rejoin.py) imports no torch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class DistEnv:
    """Who this process is among the ranks and where they meet."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    """Rank on this node: picks the device."""
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    """TCP port of the rendezvous store on master_addr (unused by a single process)."""

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "DistEnv":
        """From torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
        MASTER_PORT); a single process when they are absent."""
        env = os.environ if environ is None else environ
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
        )
