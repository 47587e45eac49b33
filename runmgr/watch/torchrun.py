"""What torchrun and Megatron's rerun machine write when a rank fails.

torchrun (``torch.distributed.run``) ends a failed job with a
``ChildFailedError`` summary whose "Root Cause (first observed failure)" block
names the first rank that failed (torch/distributed/elastic/multiprocessing/
errors/__init__.py, ``ChildFailedError.format_msg``)::

    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-23_08:16:25
      host      : node-3
      rank      : 1 (local_rank: 1)
      exitcode  : 17 (pid: 7081)
      error_file: <N/A>

Megatron's rerun state machine appends one line per rejected result to its
``--result-rejected-tracker-filename`` (megatron/core/rerun_state_machine.py)::

    ts=2026-08-22 10:11:12.123456 node=node-3 device=0 jobID=N/A rank=5 iteration=120 \
status=RerunValidationStatus.INITIAL_RUN result=nan message='...'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_ROOT = re.compile(r"Root Cause \(first observed failure\):\s*\n(.*?)(?:\n[=-]{8,}|\Z)", re.DOTALL)
_FIELD = re.compile(r"^\s*(\w+)\s*:\s*(.*?)\s*$", re.MULTILINE)
# Numbers are bounded: a job may print a block like torchrun's with thousands of digits, which int() refuses.
_RANK = re.compile(r"(?<![\d-])(-?\d{1,9})\s*\(local_rank:\s*(-?\d{1,9})\)")
_EXIT = re.compile(r"(?<![\d-])(-?\d{1,9})\s*\(pid:\s*(\d{1,9})\)")
_TRACKER = re.compile(r"ts=.+? node=(\S+) device=(\S+) jobID=\S+ rank=(\d{1,9}) iteration=(\d{1,18}) status=(\S+)")


@dataclass(frozen=True)
class TorchrunFailure:
    """The first rank torchrun saw fail (its "Root Cause" block)."""

    rank: int
    """Global rank."""
    local_rank: int
    """Rank within its node."""
    exitcode: int
    """The rank's exit status; negative for a signal (-6: SIGABRT, an NCCL watchdog)."""
    pid: int
    host: str


@dataclass(frozen=True)
class RejectedResult:
    """One line of Megatron's result-rejected tracker file."""

    node: str
    device: str
    rank: int
    iteration: int
    """1-indexed, as Megatron counts (the iteration that produced the result)."""
    status: str
    """RerunValidationStatus, without the ``RerunValidationStatus.`` prefix, lower-cased."""
    line: str


def root_cause(text: str) -> Optional[TorchrunFailure]:
    """The root-cause failure of torchrun's summary in ``text``; None when there is none."""
    block = _ROOT.search(text)
    if block is None:
        return None
    fields = dict(_FIELD.findall(block.group(1)))
    rank, exit_ = _RANK.search(fields.get("rank", "")), _EXIT.search(fields.get("exitcode", ""))
    if rank is None or exit_ is None:
        return None
    return TorchrunFailure(rank=int(rank.group(1)), local_rank=int(rank.group(2)), exitcode=int(exit_.group(1)),
                           pid=int(exit_.group(2)), host=fields.get("host", ""))


def tracker_lines(text: str) -> list[RejectedResult]:
    """Every tracker line in ``text`` (a tracker file's content, or output quoting it)."""
    found = []
    for line in text.splitlines():
        match = _TRACKER.search(line)
        if match:
            node, device, rank, iteration, status = match.groups()
            found.append(RejectedResult(node=node, device=device, rank=int(rank), iteration=int(iteration),
                                        status=status.rpartition(".")[2].lower(), line=line.strip()))
    return found
