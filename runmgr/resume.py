"""Where a new sub-run starts: the newest checkpoint that verifies and that
the logbook has seen the steps of.

A checkpoint past the last step the logbook recorded (written by workers in
the moments after their driver died, say) is not used: resuming from it would
leave steps with no metrics in the kept lineage. The trainer retires such
checkpoints when the new sub-run starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.manifest import list_checkpoints, step_of, verify_checkpoint


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint to start from (None: from initialisation) and the newer
    ones passed over, each with the reason."""

    path: str | None
    step: int
    rejected: tuple[tuple[str, str], ...] = ()


def find_resume_point(checkpoint_dir: Path, max_step: int | None = None) -> ResumePoint:
    rejected: list[tuple[str, str]] = []
    for path in reversed(list_checkpoints(checkpoint_dir)):
        step = step_of(path) or 0
        if max_step is not None and step > max_step:
            rejected.append((str(path), f"{path.name} is past step {max_step}, the last step the logbook recorded"))
            continue
        ok, reason = verify_checkpoint(path)
        if ok:
            return ResumePoint(str(path), step, tuple(rejected))
        rejected.append((str(path), reason))
    return ResumePoint(None, 0, tuple(rejected))
