"""A private stand-in for runmgr.watch.torchrun (root_cause, tracker_lines) while
that module is built on another branch: only what these tests read."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.MULTILINE)
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.MULTILINE)
_TRACKER_RANK = re.compile(r"\brank=(\d+)\b")


@dataclass(frozen=True)
class TorchrunFailure:
    rank: int
    local_rank: int
    exitcode: int
    pid: int
    host: str = ""


@dataclass(frozen=True)
class RejectedResult:
    rank: int
    line: str


def root_cause(text: str) -> Optional[TorchrunFailure]:
    _, found, block = text.rpartition("Root Cause (first observed failure):")
    rank, code = _RANK.search(block), _EXIT.search(block)
    if not found or rank is None or code is None:
        return None
    return TorchrunFailure(int(rank.group(1)), int(rank.group(2)), int(code.group(1)), int(code.group(2)))


def tracker_lines(text: str) -> list[RejectedResult]:
    return [RejectedResult(int(m.group(1)), line) for line in text.splitlines() if (m := _TRACKER_RANK.search(line))]
