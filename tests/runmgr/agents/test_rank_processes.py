"""A node's ranks forked from one server that imported the trainer once (runmgr/agents/
rank_processes.py), on real processes over gloo: they train bit for bit as fresh processes
do, every report reaches the node's side in order, and a rank killed mid-run is an end of its
own, told apart from one that raised."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runmgr.agents.rank_processes import RankProcesses, RankStart
from runmgr.ports import rendezvous_port
from tests.runmgr.agents.configs import tiny_config
from trainer.plan import ResumePlan

ITERS = 4
WORLD = 2


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


def tiny(save: Path, train_iters: int = ITERS):
    return tiny_config(save, train_iters, save_interval=2)


def run_to_the_end(ranks: RankProcesses, config) -> tuple[dict, list]:
    """Both ranks from scratch to the end; each rank's reports and the ends."""
    port = free_port()
    for rank in range(WORLD):
        ranks.start(RankStart(config, ResumePlan(), rank, WORLD, rank, "127.0.0.1", port))
    ends = []
    while len(ends) < WORLD:
        ends += ranks.ended(wait_s=5)
    return ranks.take(), sorted(ends, key=lambda end: end.rank)


def losses(reports: dict) -> list[float]:
    return [report.loss for kind, report in reports[0] if kind == "step"]


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    ranks = RankProcesses()
    try:
        yield run_to_the_end(ranks, tiny(tmp_path_factory.mktemp("forked")))
    finally:
        ranks.stop(grace_s=5)


def test_forked_ranks_train_to_the_end_and_every_report_arrives_in_order(forked):
    reports, ends = forked
    assert [(end.rank, end.kind, end.exit_code) for end in ends] == [(0, "finished", 0), (1, "finished", 0)]
    assert [kind for kind, _ in reports[0] if kind == "started"] == ["started"]
    assert [report.step for kind, report in reports[0] if kind == "step"] == list(range(1, ITERS + 1))
    assert [report.step for kind, report in reports[0] if kind == "checkpoint"] == [2, 4]
    beats = [report for kind, report in reports[1] if kind == "heartbeat"]
    assert beats and {beat.rank for beat in beats} == {1}


def test_forked_ranks_train_bit_for_bit_as_fresh_processes(forked, tmp_path):
    ranks = RankProcesses(start_method="spawn")
    try:
        fresh, ends = run_to_the_end(ranks, tiny(tmp_path / "fresh"))
    finally:
        ranks.stop(grace_s=5)
    assert [end.kind for end in ends] == ["finished", "finished"]
    assert losses(forked[0]) == losses(fresh) and len(losses(fresh)) == ITERS  # exact float equality


def test_a_killed_rank_is_a_death_and_a_raising_one_an_error_with_its_words(tmp_path):
    ranks = RankProcesses()
    try:
        port = free_port()
        # A run far longer than the test: rank 1 is killed once rank 0 reported a step.
        config = tiny(tmp_path / "killed", train_iters=1000)
        pids = [ranks.start(RankStart(config, ResumePlan(), rank, WORLD, rank, "127.0.0.1", port))
                for rank in range(WORLD)]
        while not any(kind == "step" for kind, _ in ranks.take().get(0, [])):
            assert not ranks.ended(wait_s=0.05), "a rank ended before training"
        ranks.kill(1)
        ends = []
        while not ends:
            ends = ranks.ended(wait_s=5)
        assert [(end.rank, end.kind, end.exit_code) for end in ends] == [(1, "died", -9)]
        assert "SIGKILL" in ends[0].text and pids[1] == ranks.pids()[1]
        ranks.stop(grace_s=5)  # the survivor, waiting in a collective for its dead peer
        assert ranks.ended() == [] and ranks.pids() == {}  # stopped on purpose: no end, room for the next ranks
        with pytest.raises(ProcessLookupError):
            os.kill(pids[0], 0)

        bad = tiny(tmp_path / "bad", train_iters=4)
        ranks.start(RankStart(bad, ResumePlan(start_checkpoint=str(tmp_path / "nowhere")), 0, 1, 0, "127.0.0.1",
                              free_port()))
        ends = []
        while not ends:
            ends = ranks.ended(wait_s=5)
        assert ends[0].kind == "error" and ends[0].exit_code == 1 and "nowhere" in ends[0].text
    finally:
        ranks.stop(grace_s=5)
