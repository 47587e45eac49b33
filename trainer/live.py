"""Warm recovery in plain data parallel without snapshots: a replica's live state is its copy.

In plain data parallel every replica holds the whole model and optimizer, and a step changes
them only after its collectives (the gather of the losses, then the gradient all-reduce) have
completed: the update, the loss scaler and the list of losses are local from there on. So a
peer's death leaves every survivor's live state *committed* at a step: the step before the
one whose collective failed, or that step itself when the failure came later (in a checkpoint
save). Nothing but the data position moves before the commit, and it is put back.

Survivors are at most one step apart (a step's collectives need every rank: nobody completes
step k + 1 while another survivor has not completed step k). The re-formed group resumes at
the newest committed step any survivor holds; the lowest such rank is the donor and sends its
live state to the ranks that do not hold it: the replacements and any survivor one step
behind. Steps are never lost to a rollback, and no copy is taken while all goes well
(torchft heals a replica from a live peer the same way).

Steps the driver has not recorded when the group re-forms (its ``at_most``: a report still
in flight, or lost with rank 0) are reported again by the new rank 0 from the reports every
rank keeps of its last steps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import torch

from trainer.distributed import gather_floats
from trainer.report import StepReport

KEPT_REPORTS = 4
"""Step reports each rank keeps: the steps a driver may not have recorded when a peer dies."""


@dataclass
class Committed:
    """What a rank's live state holds: the last step whose update completed, and the data position
    and dummy-iteration count at that step (a step that fails in its collectives has moved them)."""

    step: int
    cursor: int
    skipped_samples: int
    reports: deque = field(default_factory=lambda: deque(maxlen=KEPT_REPORTS))
    """The reports of the last steps (every rank builds them; rank 0 sends its own)."""

    def commit(self, step: int, cursor: int, skipped_samples: int, report: Optional[StepReport] = None) -> None:
        self.step, self.cursor, self.skipped_samples = step, cursor, skipped_samples
        if report is not None:
            self.reports.append(report)

    def reports_after(self, step: Optional[int]) -> list[StepReport]:
        """The kept reports of steps after ``step`` (None: none are missing)."""
        if step is None:
            return []
        return [report for report in self.reports if report.step > step]


@dataclass(frozen=True)
class LiveAgreement:
    """Where the re-formed group resumes and who sends the state."""

    step: int
    """The newest committed step a survivor holds."""
    donor: int
    """The lowest rank that holds it: it sends its live state."""
    receivers: tuple[int, ...]
    """The ranks that do not hold it (replacements, and survivors one step behind)."""


def agree_on_live_step(committed: Optional[int], world_size: int, device: torch.device) -> LiveAgreement:
    """A collective of the re-formed group: each rank says the step its live state is committed
    at (``committed``; None on a replacement, which holds nothing)."""
    rows = gather_floats([-1.0 if committed is None else float(committed)], world_size, device)
    return live_agreement([int(row[0]) for row in rows])


def live_agreement(steps: list[int]) -> LiveAgreement:
    """Where the group resumes, given each rank's committed step (index = rank; -1: a replacement)."""
    newest = max(steps)
    if newest < 0:
        raise RuntimeError("the re-formed group holds no live state: every rank is a replacement")
    if any(0 <= step < newest - 1 for step in steps):
        # A step's collectives need every rank: survivors two steps apart mean a broken invariant.
        raise RuntimeError(f"survivors more than one step apart: committed steps {steps}")
    return LiveAgreement(newest, steps.index(newest), tuple(rank for rank, step in enumerate(steps) if step != newest))
