"""The verified checkpoints a decision may restart from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint whose manifest verified: where it is in steps and in the data stream."""

    step: int
    consumed_samples: Optional[int] = None
    """Stream position after ``step``; None when unknown."""


def newest_at_or_before(checkpoints: Sequence[VerifiedCheckpoint], step: int) -> Optional[VerifiedCheckpoint]:
    """The newest checkpoint at ``step`` or earlier, if any."""
    eligible = [c for c in checkpoints if c.step <= step]
    return max(eligible, key=lambda c: c.step) if eligible else None


def newest(checkpoints: Sequence[VerifiedCheckpoint]) -> Optional[VerifiedCheckpoint]:
    """The newest checkpoint, if any."""
    return max(checkpoints, key=lambda c: c.step) if checkpoints else None
