"""What several decisions that end one sub-run amount to (runmgr/policy/ending.py)."""

from __future__ import annotations

from runmgr.policy.decision import Decision
from runmgr.policy.ending import merge_ending


def test_the_first_abort_wins_and_nothing_the_others_ask_is_lost():
    spike = Decision("rollback_skip", "spike", data_parallel_size=4)
    ecc = Decision("exclude_node", "ecc", exclude_nodes=("node-b",), data_parallel_size=3)
    hang = Decision("dump_and_restart", "hang", dump_stacks=True, exclude_nodes=("node-b", "node-c"))
    abort = Decision("abort", "budget spent")
    merged = merge_ending([spike, ecc, hang])
    assert (merged.chosen, merged.dump_stacks, merged.stop_group) == (0, True, True)
    assert merged.also_exclude == ("node-b", "node-c") and merged.also_resize == 3
    assert merge_ending([spike, abort, ecc]).chosen == 1


def test_a_warm_decision_keeps_the_survivors_only_alone():
    warm = Decision("restart", "rank 1 died", warm=True, replace_ranks=(1,))
    assert merge_ending([warm]).stop_group is False
    assert merge_ending([warm, Decision("rollback_skip", "spike")]).stop_group is True
    assert merge_ending([Decision("restart", "died")]).stop_group is True
