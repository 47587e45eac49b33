"""A node agent's summary: what the driver hears of a node instead of each of its ranks."""

from __future__ import annotations

from runmgr.agents.report import RankEnd
from runmgr.agents.summary import NodeSummariser, slowest_per_node
from runmgr.watch.observations import RankTimings
from trainer.report import CheckpointReport, Heartbeat, StepReport


def step_report(step, compute_times):
    return StepReport(subrun="1.00", step=step, loss=2.0, grad_norm=1.0, lr=1e-3, loss_scale=1.0, tokens=64,
                      consumed_samples=8 * step, step_time=1.0, compute_times=tuple(compute_times), skipped=False,
                      time=float(step))


def test_the_nodes_beat_is_its_laggards_and_is_sent_only_when_it_moves():
    node = NodeSummariser("node-a", "1.00", ranks=[4, 5, 6])
    node.take(4, [("heartbeat", Heartbeat(4, "step", 3, 30.0))])
    node.take(5, [("heartbeat", Heartbeat(5, "step", 2, 20.0)), ("heartbeat", Heartbeat(5, "step", 3, 30.5))])
    node.take(6, [("heartbeat", Heartbeat(6, "step", 3, 30.2))])
    assert node.report(31.0).beat == Heartbeat(4, "step", 3, 30.0)  # rank 5's newest beat is its step 3's
    node.take(5, [("heartbeat", Heartbeat(5, "step", 4, 40.5))])
    node.take(6, [("heartbeat", Heartbeat(6, "step", 4, 40.2))])
    assert node.report(41.0) is None  # rank 4 has not moved: nothing new to say
    node.take(4, [("heartbeat", Heartbeat(4, "step", 4, 40.0))])
    assert node.report(42.0).beat == Heartbeat(4, "step", 4, 40.0)


def test_a_rank_that_ended_no_longer_holds_its_node_back_and_its_end_is_urgent():
    node = NodeSummariser("node-a", "1.00", ranks=[0, 1])
    node.take(0, [("heartbeat", Heartbeat(0, "step", 5, 50.0))])
    node.take(1, [("heartbeat", Heartbeat(1, "step", 4, 40.0))])
    node.report(51.0)
    node.end(RankEnd(1, "died", "killed", 52.0, -9))
    report = node.report(52.0)
    assert report.urgent and report.ended == (RankEnd(1, "died", "killed", 52.0, -9),)
    assert report.beat == Heartbeat(0, "step", 5, 50.0)
    node.end(RankEnd(0, "finished", "", 60.0, 0))
    assert node.report(60.0).ended[0].kind == "finished" and node.done


def test_rank_zeros_step_carries_the_slowest_rank_of_each_node_and_its_other_reports_pass_through():
    rank_nodes = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    node = NodeSummariser("a", "1.00", ranks=[0, 1], rank_nodes=rank_nodes)
    checkpoint = CheckpointReport("1.00", 7, "/ckpt/7", 0.5, 7.5)
    node.take(0, [("step", step_report(7, [1.0, 1.1, 0.9, 3.0, 1.2, 1.0])), ("checkpoint", checkpoint)])
    report = node.report(8.0)
    assert [kind for kind, _ in report.items] == ["step", "timings", "checkpoint"]
    (_, step), (_, timings), (_, passed) = report.items
    assert step.compute_times == () and step.loss == 2.0 and passed == checkpoint
    assert timings == RankTimings(7, 7.0, "1.00", {1: 1.1, 3: 3.0, 4: 1.2})
    assert node.report(9.0) is None  # each report once


def test_slowest_per_node_counts_a_rank_without_a_node_as_its_own():
    assert slowest_per_node([1.0, 2.0, 5.0], {0: "a", 1: "a"}) == {1: 2.0, 2: 5.0}


def test_a_ranks_beats_into_and_out_of_a_pause_pass_once_each_for_the_status_and_chaos():
    node = NodeSummariser("node-a", "1.00", ranks=[0, 1])
    node.take(0, [("heartbeat", Heartbeat(0, "step", 5, 50.0)), ("heartbeat", Heartbeat(0, "paused", 5, 50.5)),
                  ("heartbeat", Heartbeat(0, "paused", 5, 51.0))])
    node.take(1, [("heartbeat", Heartbeat(1, "step", 5, 50.1))])
    first = node.report(51.2)
    assert first.items == (("pause", Heartbeat(0, "paused", 5, 50.5)),)  # once, not every paused beat
    node.take(0, [("heartbeat", Heartbeat(0, "paused", 5, 51.5)), ("heartbeat", Heartbeat(0, "step", 6, 52.0))])
    assert node.report(52.1).items == (("pause", Heartbeat(0, "step", 6, 52.0)),)  # released
    node.take(0, [("heartbeat", Heartbeat(0, "step", 7, 53.0))])
    node.take(1, [("heartbeat", Heartbeat(1, "step", 7, 53.0))])
    assert node.report(53.1).items == ()  # training on: the beats are the node's laggard's again


def test_the_summary_tells_a_beat_alone_from_news_so_a_quiet_node_s_beat_may_wait():
    node = NodeSummariser("node-a", "1.00", ranks=[4, 5], rank_nodes={4: "node-a", 5: "node-a", 0: "node-z"})
    assert not node.has_beat and not node.has_news
    node.take(4, [("heartbeat", Heartbeat(4, "step", 3, 30.0))])
    node.take(5, [("heartbeat", Heartbeat(5, "step", 3, 30.1))])
    assert node.has_beat and not node.has_news
    node.report(31.0)
    assert not node.has_beat  # sent
    node.take(4, [("checkpoint", CheckpointReport(subrun="1.00", step=20, path="/ckpt/20", seconds=1.0, time=31.5))])
    assert node.has_news
    node.report(32.0)
    node.end(RankEnd(5, "died", "killed", 33.0, -9))
    assert node.has_news
