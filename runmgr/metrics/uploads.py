"""How far the S3 mirror is behind the checkpoints, from what the logbook
holds: each verified checkpoint (recorded by the driver) and each verified
copy (an event ``checkpoint_uploaded``, or ``checkpoint_on_s3`` for a copy a
launch found complete, with its step, recorded by the mirror). A pure
function, tested without a logbook."""

from __future__ import annotations

from typing import Optional, Sequence


def upload_lag(checkpoints: Sequence[tuple[int, int, float]], uploads: Sequence[tuple[int, Optional[int]]],
               now: float) -> float:
    """Seconds the oldest checkpoint still waiting for its upload has waited; 0
    when none waits.

    ``checkpoints``: (journal seq, step, time recorded), in the order recorded;
    ``uploads``: (journal seq, step), in the order recorded. A checkpoint is
    mirrored when an upload of its step was recorded after it (a step trained
    again after a rollback is a new checkpoint). Only the checkpoints recorded
    after the newest mirrored one wait: an older one that was never uploaded
    (deleted by retention once a newer one was safe) holds nothing back.
    """
    newest_upload = {step: seq for seq, step in uploads}  # in order: the last upload of each step stays
    waiting = list(checkpoints)
    for index in range(len(checkpoints) - 1, -1, -1):
        seq, step, _ = checkpoints[index]
        if newest_upload.get(step, -1) > seq:
            waiting = list(checkpoints[index + 1:])
            break
    return max(0.0, now - waiting[0][2]) if waiting else 0.0
