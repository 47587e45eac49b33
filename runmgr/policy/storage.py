"""The rung for an outage of the durable tier (S3): OPT's "blob storage
issues". Pure.

Nothing is wrong with the weights or the ranks, so nothing restarts: training
goes on, each checkpoint stays on the local disk until its S3 copy verifies
(retention keeps it even beyond ``checkpoint.keep_last``), and the driver's
mirror keeps retrying with backoff, so the copies complete when S3 answers
again. The decision records that, with the checkpoints waiting; the recovery
is recorded with how long the outage lasted.
"""

from __future__ import annotations

from runmgr.policy.decision import IGNORE, KEEP_LOCAL, Decision
from runmgr.watch.incidents import Incident


def decide_storage_outage(incident: Incident) -> Decision:
    """Keep training and the local copies during an outage; record its end."""
    evidence = incident.evidence
    if incident.recovered:
        waiting = _steps(evidence.get("pending_steps", ()))
        rest = f"; still to upload: {waiting}" if waiting != "none" else "; every checkpoint is on S3 again"
        return Decision(IGNORE, f"recorded: S3 was out for {evidence.get('outage_s', 0):.0f} s and training went "
                                f"on{rest}")
    return Decision(KEEP_LOCAL, (
        f"S3 has failed uploads for {evidence.get('failed_s', 0):.0f} s -> training goes on; the checkpoints not "
        f"yet on S3 (steps {_steps(evidence.get('pending_steps', ()))}) stay on the local disk, beyond "
        f"checkpoint.keep_last if need be, and are uploaded when S3 answers (retried with backoff)"))


def _steps(steps) -> str:
    return ", ".join(str(step) for step in steps) or "none"
