"""Where a new sub-run starts: the newest checkpoint that verifies and that
the logbook has seen the steps of.

A checkpoint past the last step the logbook recorded (written by workers in
the moments after their driver died, say) is not used: resuming from it would
leave steps with no metrics in the kept lineage. The trainer retires such
checkpoints when the new sub-run starts.

A run with a durable tier (``checkpoint.s3``) has a second source of the same
checkpoints: when the local copy of a step is missing or fails verification
and a complete S3 copy exists, that copy is downloaded into the checkpoint
folder and verified by the same manifest check before it is used. Which step
a sub-run starts from is decided as before; S3 only supplies its files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from runmgr.policy.checkpoints import VerifiedCheckpoint
from trainer.manifest import checkpoint_dir, list_checkpoints, read_manifest, step_of, verify_checkpoint


class RemoteUnavailable(Exception):
    """A remote copy could not be listed or fetched; the message says why in one line."""


class RemoteCheckpoints(Protocol):
    """A durable copy of the run's checkpoints (the driver's S3 mirror)."""

    def complete_steps(self) -> list[int]:
        """Steps of the complete copies (their manifest is there), oldest first;
        raises :class:`RemoteUnavailable`."""

    def consumed_samples(self, step: int) -> Optional[int]:
        """Stream position after ``step`` as the copy's manifest records it; raises
        :class:`RemoteUnavailable`."""

    def fetch(self, step: int, save_dir: Path) -> Path:
        """Download the copy of ``step`` into ``save_dir`` (a local copy that failed is
        moved aside), each file checked against the copy's manifest; the local path.
        Raises :class:`RemoteUnavailable`."""

    @property
    def location(self) -> str:
        """Where the copies live (``s3://bucket/prefix``)."""


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint to start from (None: from initialisation) and the newer
    ones passed over, each with the reason."""

    path: str | None
    step: int
    rejected: tuple[tuple[str, str], ...] = ()
    fetched_from: str | None = None
    """Where the checkpoint was downloaded from (its S3 copy), when the local one was missing or failed."""


def find_resume_point(checkpoint_dir: Path, max_step: int | None = None,
                      limit: str = "the last step the logbook recorded",
                      remote: RemoteCheckpoints | None = None) -> ResumePoint:
    """The newest verified checkpoint at or before ``max_step``; ``limit`` says
    in the rejection reasons why newer ones may not be used. With ``remote``, a
    step whose local copy is missing or fails is fetched from there."""
    local = {step_of(path) or 0: path for path in list_checkpoints(checkpoint_dir)}
    rejected: list[tuple[str, str]] = []
    remote_steps = _remote_steps(remote, rejected)
    for step in sorted(set(local) | remote_steps, reverse=True):
        path = local.get(step, checkpoint_dir / checkpoint_dir_name(step))
        if max_step is not None and step > max_step:
            where = str(path) if step in local else remote_url(remote, step)  # type: ignore[arg-type]
            rejected.append((where, f"{path.name} is past step {max_step}, {limit}"))
            continue
        if step in local:
            ok, reason = verify_checkpoint(path)
            if ok:
                return ResumePoint(str(path), step, tuple(rejected))
            rejected.append((str(path), reason))
        if step in remote_steps:
            point = _fetched(remote, step, checkpoint_dir, rejected)  # type: ignore[arg-type]
            if point is not None:
                return point
    return _newest_megatron(checkpoint_dir, max_step, limit, rejected)


MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
"""Megatron-LM's tracker file in its ``--save`` directory: the iteration of its last complete save."""
_MEGATRON_DIR = re.compile(r"iter_(\d{7})")


def megatron_checkpoints(save_dir: Path) -> dict[int, Path]:
    """A real Megatron-LM job's own checkpoints (``iter_0000120``, no manifest) that count as
    complete, by iteration: Megatron writes its tracker file once every rank finished a save,
    so a folder past the tracker's iteration is a save cut short. None without a tracker."""
    try:
        latest = int((save_dir / MEGATRON_TRACKER).read_text().strip())
    except (OSError, ValueError):  # no tracker (not a Megatron save dir), or "release"
        return {}
    found = {}
    for path in save_dir.iterdir():
        match = _MEGATRON_DIR.fullmatch(path.name)
        if match and path.is_dir() and int(match.group(1)) <= latest and any(path.iterdir()):
            found[int(match.group(1))] = path
    return found


def _newest_megatron(save_dir: Path, max_step: int | None, limit: str,
                     rejected: list[tuple[str, str]]) -> ResumePoint:
    """Where no checkpoint of runmgr's own format serves: the newest complete one of a
    real Megatron job at or before ``max_step`` (None: from initialisation)."""
    for step, path in sorted(megatron_checkpoints(save_dir).items(), reverse=True):
        if max_step is not None and step > max_step:
            rejected.append((str(path), f"{path.name} is past step {max_step}, {limit}"))
            continue
        return ResumePoint(str(path), step, tuple(rejected))
    return ResumePoint(None, 0, tuple(rejected))


def checkpoint_dir_name(step: int) -> str:
    """``step_00000120``."""
    return checkpoint_dir(".", step).name


def remote_url(remote: RemoteCheckpoints, step: int) -> str:
    """Where the copy of ``step`` lives (``s3://bucket/prefix/step_00000120``)."""
    return f"{remote.location}/{checkpoint_dir_name(step)}"


def _remote_steps(remote: RemoteCheckpoints | None, rejected: list[tuple[str, str]]) -> set[int]:
    if remote is None:
        return set()
    try:
        return set(remote.complete_steps())
    except RemoteUnavailable as error:
        rejected.append((remote.location, f"the S3 copies cannot be listed: {error}"))
        return set()


def _fetched(remote: RemoteCheckpoints, step: int, save_dir: Path,
             rejected: list[tuple[str, str]]) -> ResumePoint | None:
    """The S3 copy of ``step`` downloaded and verified as a local one is, or None (the reason recorded)."""
    where = remote_url(remote, step)
    try:
        path = remote.fetch(step, save_dir)
    except RemoteUnavailable as error:
        rejected.append((where, f"{checkpoint_dir_name(step)} (S3 copy): {error}"))
        return None
    ok, reason = verify_checkpoint(path)
    if not ok:
        rejected.append((where, f"{reason} (S3 copy)"))
        return None
    return ResumePoint(str(path), step, tuple(rejected), fetched_from=where)


def resume_at(checkpoint_dir: Path, step: int | None, limit: str,
              remote: RemoteCheckpoints | None = None) -> ResumePoint:
    """The newest verified checkpoint at or before ``step`` (``limit`` says why
    not later), fetched from ``remote`` where the local copy is missing or fails;
    ``None`` starts from initialisation."""
    if step is None:
        return ResumePoint(None, 0)
    return find_resume_point(checkpoint_dir, max_step=step, limit=limit, remote=remote)


def listed_checkpoints(checkpoint_dir: Path, max_step: int,
                       remote: RemoteCheckpoints | None = None) -> list[VerifiedCheckpoint]:
    """Checkpoints with a complete manifest at or before ``max_step``, with their
    stream positions: what the policy may choose from (the chosen one is fully
    verified, checksums included, before a sub-run starts from it). With
    ``remote``, its complete copies count too (a step whose local copy retention
    deleted once its S3 copy verified)."""
    found = {}
    for path in list_checkpoints(checkpoint_dir):
        step = step_of(path)
        if step is None or step > max_step or not verify_checkpoint(path, check_hashes=False)[0]:
            continue
        found[step] = VerifiedCheckpoint(step, read_manifest(path).get("consumed_samples"))
    if remote is not None:
        try:
            for step in remote.complete_steps():
                if step <= max_step and step not in found:
                    found[step] = VerifiedCheckpoint(step, remote.consumed_samples(step))
        except RemoteUnavailable:
            pass  # S3 out: the policy chooses among the local ones; the outage is judged on its own
    for step in megatron_checkpoints(checkpoint_dir):  # a real Megatron job's (its stream position unknown here)
        if step <= max_step and step not in found:
            found[step] = VerifiedCheckpoint(step)
    return [found[step] for step in sorted(found)]
