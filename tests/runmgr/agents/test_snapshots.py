"""The snapshot ledger (runmgr/agents/snapshots.py): which step each rank holds in memory, as
its beats say, shared by the per-rank warm group and a node's agent, which sends only news."""

from __future__ import annotations

from runmgr.agents.snapshots import HeldSnapshot, SnapshotLedger, held_step
from trainer.report import Heartbeat


def beat(rank: int, phase: str, step: int) -> Heartbeat:
    return Heartbeat(rank, phase, step, 100.0 + step)


def test_a_snapshot_beat_holds_its_step_and_a_step_beat_only_where_live_state_serves():
    assert held_step(beat(0, "snapshot", 4), live=False) == 4
    assert held_step(beat(0, "step", 5), live=False) is None
    assert held_step(beat(0, "step", 5), live=True) == 4
    assert held_step(beat(0, "init", 0), live=True) is None


def test_the_ledger_keeps_each_rank_s_newest_step_and_says_only_what_changed():
    ledger = SnapshotLedger(live=False)
    assert ledger.beat(beat(1, "snapshot", 4)) == HeldSnapshot(1, 4)
    assert ledger.beat(beat(1, "snapshot", 4)) is None  # no news: an agent pushes nothing
    assert ledger.beat(beat(1, "step", 6)) is None
    assert ledger.hold(HeldSnapshot(1, 2)) is None and ledger.step_of(1) == 4  # an older step is ignored
    assert ledger.beat(beat(1, "snapshot", 8)) == HeldSnapshot(1, 8)
    ledger.committed(9)  # not live: rank 0's committed step holds nothing in memory
    assert ledger.step_of(0) is None
    ledger.clear()
    assert ledger.step_of(1) is None


def test_under_live_state_rank_0_s_committed_step_is_held():
    ledger = SnapshotLedger(live=True)
    ledger.committed(7)
    assert ledger.step_of(0) == 7
    assert ledger.beat(beat(0, "step", 6)) is None  # 5 is older than 7
