"""The warm link of ranks forked by a node's agent (runmgr/agents/warm_link.py), on real forked
processes over gloo, no Ray: a rank whose peer was killed says it waits in its link, up its
pipe; a spare forked beside it builds its model and says it waits; the agent's side answers
both down their pipes, the spare takes the lost rank's place, and the run ends with the
unbroken run's losses, bit for bit. A spare answered None is released, a plain end."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from runmgr.agents.rank_processes import RankProcesses, RankStart, spare_key
from runmgr.agents.report import RankEnd
from runmgr.ports import rendezvous_port
from tests.runmgr.agents.configs import tiny_config
from trainer.distributed import DistEnv
from trainer.plan import ResumePlan
from trainer.rejoin import Rejoin

ITERS = 8
WORLD = 2
KILL_AFTER_STEP = 3
POLL_S = 0.05
"""How long each look at the ranks waits for one to end: the pace of the loops below, which
wait on what the ranks report, never on the clock."""


def warm_config(save: Path):
    """The agents' tiny run, warm: plain data parallel, so any survivor's live state serves."""
    config = tiny_config(save, ITERS, save_interval=100)
    return replace(config, checkpoint=replace(config.checkpoint, memory_interval=2))


def losses(reports: list) -> list[tuple[int, float]]:
    """Rank 0's (step, loss), the last report of each step (a resumed step is reported again)."""
    by_step = {report.step: report.loss for kind, report in reports if kind == "step"}
    return sorted(by_step.items())


def start_ranks(ranks: RankProcesses, config, warm: bool) -> None:
    port = rendezvous_port()
    for rank in range(WORLD):
        ranks.start(RankStart(config, ResumePlan(), rank, WORLD, rank, "127.0.0.1", port, warm=warm))


def collect(ranks: RankProcesses, reports: dict, ends: list[RankEnd]) -> None:
    """What the ranks said since the last look, and the ends that came."""
    for key, items in ranks.take().items():
        reports.setdefault(key, []).extend(items)
    ends += ranks.ended(wait_s=POLL_S)


def unbroken_losses(tmp_path: Path) -> list[tuple[int, float]]:
    ranks = RankProcesses()
    reports: dict = {}
    ends: list[RankEnd] = []
    try:
        start_ranks(ranks, warm_config(tmp_path / "unbroken"), warm=True)
        while len(ends) < WORLD:
            collect(ranks, reports, ends)
    finally:
        ranks.stop(grace_s=5)
    assert [end.kind for end in ends] == ["finished", "finished"]
    return losses(reports[0])


def test_a_forked_rank_rejoins_through_its_pipe_with_a_forked_spare_bit_for_bit(tmp_path):
    expected = unbroken_losses(tmp_path)
    config = warm_config(tmp_path / "warm")
    ranks = RankProcesses()
    reports: dict = {}
    ends: list[RankEnd] = []
    spare = spare_key(0)
    try:
        ranks.start(RankStart(config, ResumePlan(), spare, WORLD, WORLD, "127.0.0.1", 0, spare=True))
        start_ranks(ranks, config, warm=True)
        while spare not in ranks.waiting():  # built, waiting to be named: ready
            collect(ranks, reports, ends)
            assert not ends, f"a rank ended before the spare was ready: {ends}"
        collect(ranks, reports, ends)  # the report that said so, taken after the flag was seen
        assert ("waiting", spare) in reports[spare]
        while not any(kind == "step" and report.step >= KILL_AFTER_STEP for kind, report in reports.get(0, [])):
            collect(ranks, reports, ends)
            assert not ends, f"a rank ended before the kill: {ends}"
        ranks.kill(1)
        while 0 not in ranks.waiting():  # the survivor's collective broke: it waits in its link
            collect(ranks, reports, ends)
        collect(ranks, reports, ends)
        assert [(end.rank, end.kind) for end in ends if end.rank == 1] in ([], [(1, "died")])
        assert ("waiting", 0) in reports[0]

        port = rendezvous_port()
        ranks.rename(spare, 1)
        plan = ResumePlan()
        assert ranks.answer(0, Rejoin(DistEnv(0, WORLD, 0, "127.0.0.1", port), plan, {1: 0}))
        assert ranks.answer(1, Rejoin(DistEnv(1, WORLD, 1, "127.0.0.1", port), plan, {1: 0}))
        assert ranks.waiting() == set()
        ends = [end for end in ends if end.rank != 1]  # the killed process's end, if it came first
        while sorted(end.rank for end in ends if end.kind == "finished") != [0, 1]:
            collect(ranks, reports, ends)
            assert all(end.kind == "finished" for end in ends), ends
    finally:
        ranks.stop(grace_s=5)
    assert losses(reports[0]) == expected and len(expected) == ITERS  # exact float equality
    # The spare's reports after it was named are rank 1's, under rank 1.
    assert {beat.rank for kind, beat in reports[1] if kind == "heartbeat"} == {1}


def test_a_spare_answered_none_is_released_and_a_gone_process_is_not_answered(tmp_path):
    ranks = RankProcesses()
    ends: list[RankEnd] = []
    spare = spare_key(0)
    try:
        ranks.start(RankStart(warm_config(tmp_path / "spare"), ResumePlan(), spare, WORLD, 0, "127.0.0.1", 0,
                              spare=True))
        while spare not in ranks.waiting():
            ends += ranks.ended(wait_s=POLL_S)
            assert not ends, f"the spare ended before it was ready: {ends}"
        assert ranks.answer(spare, None)
        while not ends:
            ends += ranks.ended(wait_s=POLL_S)
        assert [(end.rank, end.kind, end.text) for end in ends] == [(spare, "finished", "'released'")]
        assert not ranks.answer(spare, None)  # its process is gone
    finally:
        ranks.stop(grace_s=5)
