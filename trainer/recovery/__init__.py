"""Fault tolerance for the training loop, kept out of it: the loop calls a
:class:`Recovery`'s hooks (hooks.py) at fixed points of each step, and knows nothing
of what they do. The default, :class:`NoRecovery`, survives nothing.

Warm recovery (trainer/warm.py describes it) survives a peer's death in the same
process: regroup.py re-forms the group, live.py resumes plain data parallel from a
replica's live state, snapshot.py every other layout from in-memory snapshots kept by
buddies, spare.py brings a ready spare into the re-formed group; state.py is what
travels. factory.py picks one.
"""

from trainer.recovery.factory import recovery_for, warm_recovery
from trainer.recovery.hooks import NoRecovery, Recovery, RecoveryFactory
from trainer.recovery.spare import Joined, joined_as_spare

__all__ = ["Joined", "NoRecovery", "Recovery", "RecoveryFactory", "joined_as_spare", "recovery_for", "warm_recovery"]
