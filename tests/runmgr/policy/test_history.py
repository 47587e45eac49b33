"""What the policy remembers."""

from __future__ import annotations

from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.decision import EXCLUDE_NODE, IGNORE, LOWER_LR, RESTART, ROLLBACK_SKIP, Decision
from runmgr.policy.history import History
from runmgr.watch.incidents import Incident


def incident(onset, subrun="12.00"):
    return Incident(kind="loss_spike", time=0.0, description="", subrun=subrun, onset_step=onset)


def test_record_returns_a_new_history_and_leaves_the_old_one_alone():
    empty = History()
    one = empty.record(incident(10), Decision(IGNORE, "x"))
    assert empty.entries == () and len(one.entries) == 1


def test_lr_scale_clip_and_exclusions_accumulate():
    history = History()
    history = history.record(incident(10), Decision(LOWER_LR, "", lr_factor=0.5, clip_grad=0.5))
    history = history.record(incident(20), Decision(LOWER_LR, "", lr_factor=0.8))
    history = history.record(incident(30), Decision(EXCLUDE_NODE, "", exclude_nodes=("a", "b")))
    history = history.record(incident(40), Decision(EXCLUDE_NODE, "", exclude_nodes=("b", "c")))
    assert history.lr_scale() == 0.4 and history.clip_grad() == 0.5
    assert history.excluded_nodes() == ("a", "b", "c") and history.fault_restarts() == 2


def test_stuck_restarts_count_only_those_without_a_newer_checkpoint():
    old, new = [VerifiedCheckpoint(100)], [VerifiedCheckpoint(100), VerifiedCheckpoint(200)]
    history = History()
    history = history.record(incident(1, "a"), Decision(RESTART, ""), old)
    history = history.record(incident(2, "b"), Decision(RESTART, ""), new)
    history = history.record(incident(3, "c"), Decision(IGNORE, ""), new)
    history = history.record(incident(4, "d"), Decision(ROLLBACK_SKIP, ""), new)
    assert [e.incident.onset_step for e in history.stuck_restarts(200)] == [4, 2]


def test_the_instability_chain_follows_onsets_within_the_window():
    history = History()
    for onset in (1000, 5000, 5300, 5100):
        history = history.record(incident(onset), Decision(ROLLBACK_SKIP, ""))
    assert [e.incident.onset_step for e in history.instability_streak(5200, 500)] == [5100, 5300, 5000]
