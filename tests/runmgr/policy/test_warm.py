"""Warm or cold: a fault's restart is warm only when every lost rank's snapshot is on a node
that is not lost and a ready spare waits for each; otherwise cold, and the reason says why."""

from __future__ import annotations

from runmgr.config.policy import PolicyConfig, RestartConfig
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.decision import DUMP_AND_RESTART, EXCLUDE_NODE, RESTART, RETRY_LAUNCH
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.policy.warm import WarmCover, buddy_offset, warm_verdict
from runmgr.watch.incidents import HANG, LAUNCH_FAILURE, WORKER_DEATH, Incident
from trainer.parallel.layout import Layout, Sharding
from trainer.rejoin import snapshot_holders

CHECKPOINTS = (VerifiedCheckpoint(400, 400 * 64),)
# Four ranks, two per node; each rank's snapshot is also on the other node (its data-parallel peer's).
COVER = WarmCover(snapshot_step=437, rank_nodes={0: "a", 1: "a", 2: "b", 3: "b"},
                  holders={0: ("a", "b"), 1: ("a", "b"), 2: ("b", "a"), 3: ("b", "a")}, spares={"c": 2})


def death(category: str, rank: int = 3, node: str = "b", subrun: str = "12.00") -> Incident:
    return Incident(kind=WORKER_DEATH, time=0.0, description=f"rank {rank} died", subrun=subrun, ranks=(rank,),
                    nodes=(node,), evidence={"cause": category, "category": category})


def test_a_killed_rank_restarts_warm_from_the_memory_snapshot_on_a_spare():
    decision = decide(death("killed"), History(), PolicyConfig(), CHECKPOINTS, warm=COVER)
    assert (decision.action, decision.warm, decision.replace_ranks) == (RESTART, True, (3,))
    assert (decision.restart_from_step, decision.restart_point) == (437, "memory")
    assert "warm: the survivors keep their state, rank(s) 3 restart on ready spares" in decision.reason
    assert decision.to_dict()["warm"] is True


def test_a_lost_node_replaces_all_its_ranks_from_the_peer_node_s_memory():
    decision = decide(death("hardware"), History(), PolicyConfig(), CHECKPOINTS, warm=COVER)
    assert (decision.action, decision.exclude_nodes, decision.warm, decision.replace_ranks) == (
        EXCLUDE_NODE, ("b",), True, (2, 3))


def test_without_enough_spares_or_a_surviving_copy_the_restart_is_cold_and_says_why():
    one_spare = WarmCover(COVER.snapshot_step, COVER.rank_nodes, COVER.holders, {"c": 1})
    decision = decide(death("hardware"), History(), PolicyConfig(), CHECKPOINTS, warm=one_spare)
    assert (decision.warm, decision.restart_from_step) == (False, 400)
    assert "cold: 1 ready spare(s) for 2 lost rank(s)" in decision.reason
    own_only = WarmCover(437, COVER.rank_nodes, {r: (n,) for r, n in COVER.rank_nodes.items()}, {"c": 2})
    assert "only on nodes that are lost" in decide(death("hardware"), History(), PolicyConfig(), CHECKPOINTS,
                                                   warm=own_only).reason
    spare_on_lost_node = WarmCover(437, COVER.rank_nodes, COVER.holders, {"b": 2})
    assert not decide(death("hardware"), History(), PolicyConfig(), CHECKPOINTS, warm=spare_on_lost_node).warm


def test_a_hang_is_cold_and_a_group_without_warm_state_reads_as_before():
    hang = Incident(kind=HANG, time=0.0, description="silent", subrun="12.00", onset_step=440, ranks=(1,),
                    nodes=("a",), evidence={})
    decision = decide(hang, History(), PolicyConfig(), CHECKPOINTS, warm=COVER)
    assert (decision.action, decision.warm) == (DUMP_AND_RESTART, False)
    assert "cold: a hang restarts every rank" in decision.reason
    plain = decide(death("killed"), History(), PolicyConfig(), CHECKPOINTS)
    assert not plain.warm and "cold" not in plain.reason


def test_a_warm_restart_spends_the_restart_budget_like_a_cold_one():
    config = PolicyConfig(restarts=RestartConfig(max_restarts=1))
    first = decide(death("killed"), History(), config, CHECKPOINTS, warm=COVER)
    history = History().record(death("killed"), first, CHECKPOINTS)
    second = decide(death("killed", subrun="12.01"), history, config, CHECKPOINTS, warm=COVER)
    assert first.warm and second.action == "abort" and "restart budget is spent (1 of 1" in second.reason


def test_a_failed_warm_restart_is_followed_by_a_cold_one_at_once():
    failed = Incident(kind=LAUNCH_FAILURE, time=0.0, description="x", subrun="12.01",
                      evidence={"error": "spare on c died", "warm": True})
    decision = decide(failed, History(), PolicyConfig(), CHECKPOINTS)
    assert (decision.action, decision.wait_s, decision.warm, decision.restart_from_step) == (RETRY_LAUNCH, 0.0,
                                                                                             False, 400)
    assert "warm restart of sub-run 12.01 failed (spare on c died) -> restart cold now" in decision.reason


def test_a_snapshot_older_than_the_newest_checkpoint_is_not_used():
    verdict = warm_verdict(WarmCover(390, COVER.rank_nodes, COVER.holders, COVER.spares), (3,), (), (), 400)
    assert not verdict.warm and "older than the newest verified checkpoint (step 400)" in verdict.note
    assert not warm_verdict(WarmCover(None, COVER.rank_nodes, COVER.holders, COVER.spares), (3,), (), (), 400).warm


def test_each_rank_s_buddy_sits_on_another_node_when_there_is_one():
    # Two ranks a node, packed: the rank two on is on the other node; one rank a node: the next one.
    assert buddy_offset(["a", "a", "b", "b"]) == 2
    assert buddy_offset(["a", "b", "c"]) == 1
    assert buddy_offset(["a", "a", "a", "b", "b", "b"]) == 3
    assert buddy_offset(["a", "a"]) == 1  # one node: the buddy survives a lost process, not a lost node


def test_a_sharded_rank_is_warm_while_its_buddy_s_node_lives_and_cold_when_both_copies_are_lost():
    # ZeRO-1 over four ranks on nodes a, a, b, b: rank r's snapshot is on its node and rank r+2's.
    layout = Layout(dp=4, sharding=Sharding.zero1)
    nodes = {0: "a", 1: "a", 2: "b", 3: "b"}
    offset = buddy_offset(list(nodes.values()))
    holders = {rank: tuple(nodes[h] for h in snapshot_holders(rank, layout, offset)) for rank in nodes}
    assert holders == {0: ("a", "b"), 1: ("a", "b"), 2: ("b", "a"), 3: ("b", "a")}
    cover = WarmCover(437, nodes, holders, {"c": 2})
    assert decide(death("hardware"), History(), PolicyConfig(), CHECKPOINTS, warm=cover).warm
    # Buddies on the same node (offset 1 over a, a, b, b): rank 2's copy is on b alone.
    same_node = {rank: tuple(dict.fromkeys(nodes[h] for h in snapshot_holders(rank, layout, 1))) for rank in nodes}
    decision = decide(death("hardware"), History(), PolicyConfig(), CHECKPOINTS,
                      warm=WarmCover(437, nodes, same_node, {"c": 2}))
    assert not decision.warm and "rank(s) 2 is only on nodes that are lost" in decision.reason
