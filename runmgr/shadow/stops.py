"""Lines that say a followed job is being stopped on purpose (its scheduler or a person), so that
the silence after them is not a hang: Slurm's cancellation (``slurmstepd: error: *** STEP
4471203.0 ON gpu-node-017 CANCELLED AT 2025-06-11T09:37:34 ***``, also ``*** JOB ...``) and
torchrun's agent receiving SIGTERM or SIGINT (``Received Signals.SIGTERM death signal, shutting
down workers``, torch/distributed/elastic/agent/server/api.py)."""

from __future__ import annotations

import re
from typing import Optional

_STOPS = (
    re.compile(r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+"),
    re.compile(r"Received Signals\.(?:SIGTERM|SIGINT) death signal"),
)


def stop_of(line: str) -> Optional[str]:
    """What in ``line`` says the job is being stopped (None: nothing)."""
    for pattern in _STOPS:
        found = pattern.search(line)
        if found:
            return found.group(0)
    return None
