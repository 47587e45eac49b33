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

from runmgr.policy.checkpoints import VerifiedCheckpoint
from trainer.manifest import list_checkpoints, read_manifest, step_of, verify_checkpoint


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint to start from (None: from initialisation) and the newer
    ones passed over, each with the reason."""

    path: str | None
    step: int
    rejected: tuple[tuple[str, str], ...] = ()


def find_resume_point(checkpoint_dir: Path, max_step: int | None = None,
                      limit: str = "the last step the logbook recorded") -> ResumePoint:
    """The newest verified checkpoint at or before ``max_step``; ``limit`` says
    in the rejection reasons why newer ones may not be used."""
    rejected: list[tuple[str, str]] = []
    for path in reversed(list_checkpoints(checkpoint_dir)):
        step = step_of(path) or 0
        if max_step is not None and step > max_step:
            rejected.append((str(path), f"{path.name} is past step {max_step}, {limit}"))
            continue
        ok, reason = verify_checkpoint(path)
        if ok:
            return ResumePoint(str(path), step, tuple(rejected))
        rejected.append((str(path), reason))
    return ResumePoint(None, 0, tuple(rejected))


def resume_at(checkpoint_dir: Path, step: int | None, limit: str) -> ResumePoint:
    """The newest verified checkpoint at or before ``step`` (``limit`` says why
    not later); ``None`` starts from initialisation."""
    if step is None:
        return ResumePoint(None, 0)
    return find_resume_point(checkpoint_dir, max_step=step, limit=limit)


def listed_checkpoints(checkpoint_dir: Path, max_step: int) -> list[VerifiedCheckpoint]:
    """Checkpoints with a complete manifest at or before ``max_step``, with their
    stream positions: what the policy may choose from (the chosen one is fully
    verified, checksums included, before a sub-run starts from it)."""
    found = []
    for path in list_checkpoints(checkpoint_dir):
        step = step_of(path)
        if step is None or step > max_step or not verify_checkpoint(path, check_hashes=False)[0]:
            continue
        found.append(VerifiedCheckpoint(step, read_manifest(path).get("consumed_samples")))
    return found
