"""A Megatron-style job under the worker group: real torchrun processes of a
fake pretrain script on a real local Ray. What the group reports is what the
controller and the watcher act on: the steps and checkpoints the log shows,
and one failure per failed node naming the rank to blame."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from runmgr.config.policy import PolicyConfig
from runmgr.config.watcher import WatcherConfig
from runmgr.controller.group import GroupPoll
from runmgr.controller.judge import Judge
from runmgr.nodes import node_name
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.watch.observations import CheckpointObservation, StepObservation
from runmgr.workers import proctree
from tests.runmgr.workers.megatron_helpers import kept_nodes, make_group, poll_until
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

pytestmark = pytest.mark.slow
PLAN = ResumePlan(subrun="3.01")


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    where = tmp_path / "gate"
    where.mkdir()
    return where


@pytest.fixture(scope="module")
def one_node(local_ray):
    """One node actor of two ranks that the module's one-node failures take in turn, as a lineage's
    runner keeps its node actors across sub-runs (each job hears only its own command: the kept
    lineage's test checks it): a Ray worker's start each, not four."""
    kept = kept_nodes(nproc=2)
    yield kept
    kept.close()


def started(local_ray, args, **kwargs):
    group = make_group(args, **kwargs)
    workers = group.start(TrainerConfig(), PLAN)
    return group, workers


def judged(failure, workers, subrun: str = PLAN.subrun):
    """The incident and the decision the driver's judge makes of ``failure`` (default
    watcher and policy, a verified checkpoint at step 20, two spare-less nodes)."""
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda max_step: [VerifiedCheckpoint(20, 160)])
    judge.start_subrun(workers)
    [judgement] = judge.judge(subrun, GroupPoll(failures=[failure]), [], failure.time, 25)
    return judgement.incident, judgement.decision


def judged_poll(poll, workers):
    """The one incident and decision the driver's judge makes of one poll with failures."""
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda max_step: [VerifiedCheckpoint(20, 160)])
    judge.start_subrun(workers)
    [judgement] = judge.judge(PLAN.subrun, poll, [], poll.failures[0].time, 25)
    return judgement.incident, judgement.decision


def failure_of(mode: str, gate: Path, kept, *args: str):
    """The one failure a job of the fake script in ``mode`` ends with (one node of two ranks, on the
    ``kept`` node actor), its ranks, and what was seen."""
    group, workers = started(None, ["--mode", mode, "--gate", str(gate), *args], kept=kept)
    try:
        failure, seen = only_failure(group)
    finally:
        group.shutdown()
    return failure, workers, seen


def only_failure(group, seen=None):
    seen = poll_until(group, lambda s: s.all("failures"), seen)
    failures = seen.all("failures")
    assert len(failures) == 1, failures
    return failures[0], seen


def test_a_failed_validation_blames_the_rank_the_tracker_file_names(one_node, gate, tmp_path):
    tracker = tmp_path / "rejected.txt"
    tracker.write_text("ts=2026-08-01 node=old device=0 jobID=N/A rank=0 iteration=2 status=initial_run "
                       "result=nan message='an earlier sub-run'\n")
    failure, workers, _ = failure_of("validation", gate, one_node, "--result-rejected-tracker-filename", str(tracker))
    # Rank 0 exited first (torchrun's root cause); the tracker line of this sub-run names rank 1.
    assert failure.rank == 1 and failure.worker == workers[1]
    assert failure.text.startswith("rank 1 exited with code 17")
    incident, decision = judged(failure, workers)
    assert (incident.kind, incident.evidence["category"]) == ("worker_death", "validation")
    assert decision.action == "exclude_node" and decision.exclude_nodes == (node_name(workers[1].node_id),)
    assert "rank=1 iteration=7 status=RerunValidationStatus.INITIAL_RUN" in failure.text
    assert "an earlier sub-run" not in failure.text


def test_an_nccl_watchdog_abort_is_the_aborting_ranks_failure_with_its_text(one_node, gate):
    failure, workers, _ = failure_of("watchdog", gate, one_node)
    incident, decision = judged(failure, workers)
    assert (incident.kind, incident.evidence["category"], decision.action) == ("worker_death", "network", "restart")
    assert failure.rank == 1
    assert failure.text.startswith("rank 1 exited with code -6")
    assert "Watchdog caught collective operation timeout" in failure.text
    assert "we are taking the entire process down" in failure.text
    assert "raise ChildFailedError" not in failure.text  # torchrun's own traceback says nothing more


def test_an_hccl_heartbeat_lost_exit_carries_the_hccl_text(one_node, gate):
    failure, workers, _ = failure_of("hccl", gate, one_node)
    incident, decision = judged(failure, workers)
    assert (incident.kind, incident.evidence["category"], decision.action) == ("worker_death", "network", "restart")
    assert failure.rank == 1
    assert failure.text.startswith("rank 1 exited with code 1")
    assert "EI0002" in failure.text and "[Heartbeat Lost Occurred]" in failure.text


def test_a_nan_megatron_raised_is_a_divergence_for_the_ladder_not_a_bug(one_node, gate):
    failure, workers, seen = failure_of("nan", gate, one_node)
    assert failure.rank == 1 and "Unexpected result nan" in failure.text
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda max_step: [VerifiedCheckpoint(0, 0)])
    judge.start_subrun(workers)
    steps = GroupPoll(observations=[o for o in seen.all("observations") if isinstance(o, StepObservation)])
    assert judge.judge(PLAN.subrun, steps, [], failure.time, 3) == []
    [judgement] = judge.judge(PLAN.subrun, GroupPoll(failures=[failure]), [], failure.time, 3)
    incident, decision = judgement.incident, judgement.decision
    assert (incident.kind, incident.onset_step, incident.onset_sample, incident.samples_per_step) == ("nonfinite", 4,
                                                                                                     24, 8)
    assert decision.action == "rollback_skip" and decision.skip_ranges  # the iteration's batch is skipped


def test_a_survivors_echo_that_ends_first_waits_in_its_poll_for_the_killed_rank_it_echoes(local_ray, gate):
    """Node 1's rank prints gloo's broken collective and its torchrun ends; only then is node 0's
    rank killed. The poll that takes node 1's end waits for node 0's (``settle_s``; the test's
    is long only so that a loaded machine cannot end the wait first: the poll ends as soon as
    both nodes ended), so the judge names the killed rank, not its echo."""
    group, workers = started(local_ray, ["--mode", "echo_first", "--gate", str(gate)], nodes=2, nproc=1,
                             settle_s=60.0)

    def kill_rank_0_once_node_1_ended(torchrun_of_node_1: int) -> None:
        while proctree.alive(torchrun_of_node_1):
            time.sleep(0.05)
        (gate / "kill-0").touch()

    try:
        torchrun_of_node_1 = proctree.parent_of(workers[1].pid)
        assert torchrun_of_node_1 is not None
        threading.Thread(target=kill_rank_0_once_node_1_ended, args=(torchrun_of_node_1,), daemon=True).start()
        (gate / "echo-1").touch()
        seen = poll_until(group, lambda s: s.all("failures"))
    finally:
        group.shutdown()
    [poll] = [p for p in seen.polls if p.failures]
    assert sorted(f.rank for f in poll.failures) == [0, 1]  # both ends in the poll that took the first
    incident, decision = judged_poll(poll, workers)
    assert incident.kind == "worker_death" and incident.ranks == (0,), incident
    assert "SIGKILL" in incident.description and decision.action == "restart"


def test_a_job_that_trains_and_ends_then_a_rerun_exit_in_the_same_node_actor_hears_only_its_own_command(
        local_ray, gate, tmp_path):
    """A lineage's node actors are kept (runmgr/workers/megatron_nodes.py): the next sub-run of
    as many nodes runs in the same actor processes and hears only its own command; a sub-run
    of another size gets new ones. Its first sub-run is a job that trains and ends (its steps,
    its checkpoint, its end), its second one that exits as Megatron's resume to disambiguate,
    its third (two nodes of two ranks) one whose rank is killed by its pid, then shut down."""
    kept = kept_nodes(nproc=2)
    try:
        save = tmp_path / "save"
        first = make_group(["--mode", "ok", "--gate", str(gate), "--save", str(save)], kept=kept,
                           checkpoint_dir=save, seq_length=16)
        workers = first.start(TrainerConfig(), PLAN)
        try:
            assert [w.rank for w in workers] == [0, 1]
            for worker in workers:  # each rank's own process, the one chaos kills
                assert proctree.environment(worker.pid)["RANK"] == str(worker.rank)
            (gate / "release").touch()
            ended = poll_until(first, lambda s: set(s.all("finished_ranks")) == {0, 1})
        finally:
            first.shutdown()
        a_job_that_trained_and_ended(ended, save)
        actor_pid = kept.for_subrun(1, ())[1][0]["pid"]

        second = make_group(["--mode", "rerun", "--gate", str(gate)], kept=kept)
        workers = second.start(TrainerConfig(), ResumePlan(subrun="3.02"))
        try:
            failure, seen = only_failure(second)
        finally:
            second.shutdown()
        assert kept.placed == 1 and kept.for_subrun(1, ())[1][0]["pid"] == actor_pid  # the same actor process
        assert not seen.all("steps") and not seen.all("finished_ranks")  # nothing of the first command
        assert failure.exit_code == 16 and "lm loss" not in failure.text  # none of the first command's lines
        megatrons_resume_to_disambiguate_exit(failure, workers)

        wider = make_group(["--mode", "forever", "--gate", str(gate)], nodes=2, nproc=2, kept=kept)
        workers = wider.start(TrainerConfig(), ResumePlan(subrun="3.03"))  # shut down by the check below
        a_rank_killed_by_its_pid_is_that_ranks_failure_and_shutdown_leaves_no_process_of_any_node(
            wider, workers, gate, tmp_path)
        assert kept.placed == 3  # two new nodes: the sub-run wanted two, not one
    finally:
        kept.close()


def a_rank_killed_by_its_pid_is_that_ranks_failure_and_shutdown_leaves_no_process_of_any_node(
        group, workers, gate: Path, tmp_path: Path) -> None:
    """A job of two nodes of two ranks that trains until node 1's last rank is killed by its pid
    (after every rank's stacks were dumped): the failure names that rank, its worker, exit -9; the
    group's shutdown leaves no process of either node, the killed rank's orphaned grandchild among them."""
    ranks = range(len(workers))
    try:
        poll_until(group, lambda s: all((gate / f"pids-{rank}").exists() for rank in ranks))
        ranks_and_grandchildren = [int(p) for rank in ranks for p in (gate / f"pids-{rank}").read_text().split()]
        assert [w.pid for w in workers] == ranks_and_grandchildren[::2]
        torchruns = [proctree.parent_of(w.pid) for w in workers]
        stacks = group.dump_stacks(tmp_path / "stacks")
        assert [p.name for p in stacks] == ["rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt"]
        assert stacks[3].read_text().startswith(f"rank 3  pid {workers[3].pid}  node rank 1")
        seen = poll_until(group, lambda s: s.all("steps"))  # it trains: the kill lands in a running job
        os.kill(workers[3].pid, signal.SIGKILL)
        failure, _ = only_failure(group, seen)
    finally:
        group.shutdown()
    assert failure.rank == 3 and failure.worker == workers[3]
    assert failure.text.startswith("rank 3 exited with code -9")
    # Every process of both nodes (two torchruns, four ranks, their four grandchildren) is gone.
    everything = [*torchruns, *ranks_and_grandchildren]
    assert len(set(everything)) == 10
    assert [pid for pid in everything if proctree.alive(pid)] == []


def a_job_that_trained_and_ended(seen, save: Path) -> None:
    """What the group reported of a job that trains 3 iterations, saves at 2 and ends."""
    assert not seen.all("failures")
    steps = seen.all("steps")
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.loss for s in steps] == pytest.approx([4.9, 4.8, 4.7])
    assert {(s.subrun, s.tokens, s.consumed_samples) for s in steps[:1]} == {("3.01", 8 * 16, 8)}
    assert all(s.compute_times == () and not s.skipped and not math.isnan(s.grad_norm) for s in steps)
    observations = seen.all("observations")
    assert [o.step for o in observations if isinstance(o, StepObservation)] == [1, 2, 3]
    assert {o.subrun for o in observations} == {"3.01"}  # the plan's id, not the parser's own numbering
    assert [o.step for o in observations if isinstance(o, CheckpointObservation)] == [2]
    [checkpoint] = seen.all("checkpoints")
    assert (checkpoint.step, checkpoint.path, checkpoint.subrun) == (2, str(save / "iter_0000002"), "3.01")
    beats = {(b.rank, b.phase, b.step) for b in seen.all("heartbeats")}
    assert {(0, "init", 0), (1, "init", 0), (0, "step", 3), (1, "step", 3)} <= beats
    commands = seen.polls[0].commands
    assert [c["node_rank"] for c in commands] == [0] and "--nproc-per-node" in commands[0]["argv"]
    assert all(not poll.commands for poll in seen.polls[1:])


def megatrons_resume_to_disambiguate_exit(failure, workers) -> None:
    """Megatron's exit 16 is one failure with its code and message, a restart from the checkpoint it saved."""
    incident, decision = judged(failure, workers, "3.02")
    assert (incident.kind, incident.evidence["category"], decision.action) == ("worker_death", "rerun", "restart")
    assert decision.restart_point == "newest_at_restart"  # the checkpoint Megatron saved before exiting
    assert failure.rank in (0, 1) and failure.kind == "error"
    assert failure.text.startswith(f"rank {failure.rank} exited with code 16")
    assert "Please resume the job from the checkpoint to rerun the last iteration" in failure.text
    assert "Root Cause (first observed failure)" in failure.text
