"""The silences a sub-run's own plan makes, so that the hang watch expects them.

A Megatron job prints one line per iteration and nothing while it does other
work: the iterations a rollback asked it to skip (``--iterations-to-skip``:
a dummy step each, no line), an evaluation every ``--eval-interval``
iterations (``--eval-iters`` forward passes), a save every
``--save-interval``, and, after its last iteration, the final save and its
teardown. None of these is a hang: runmgr asked for the skips itself, and the
rest is the job's own schedule. :class:`PlannedSilences` says where they fall;
the hang detector (runmgr/watch/hang.py) widens its window after a beat that
one follows, by what the job's measured iteration and save times say it takes.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PlannedSilences:
    """Where a sub-run is silent by plan; built from the sub-run's own command line."""

    subrun: str
    time: float
    """When the sub-run started (the observation's time)."""
    skipped: tuple[int, ...] = ()
    """Iterations run as silent dummy steps (1-indexed, sorted): no line, the batch consumed."""
    eval_interval: Optional[int] = None
    """An evaluation after every iteration that this divides (None: no evaluation)."""
    eval_iters: int = 0
    """Forward passes of one evaluation."""
    save_interval: Optional[int] = None
    """A save after every iteration that this divides (None: only the final save)."""
    final_step: Optional[int] = None
    """The job's last iteration (``--train-iters``): after it, the final save and the teardown."""

    def skipped_after(self, step: int) -> int:
        """How many skipped iterations follow ``step`` without a line in between."""
        index = bisect_right(self.skipped, step)
        count = 0
        while index + count < len(self.skipped) and self.skipped[index + count] == step + 1 + count:
            count += 1
        return count

    def evaluates_after(self, step: int) -> bool:
        """True when the job evaluates once ``step`` is done."""
        return bool(self.eval_interval and self.eval_iters and step > 0 and step % self.eval_interval == 0)

    def saves_after(self, step: int) -> bool:
        """True when the job saves once ``step`` is done (its interval, or its last iteration)."""
        return bool(step > 0 and ((self.save_interval and step % self.save_interval == 0) or self.is_final(step)))

    def is_final(self, step: int) -> bool:
        """True at or past the job's last iteration."""
        return self.final_step is not None and step >= self.final_step
