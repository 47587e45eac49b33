"""A warm restart end to end: a real `runmgr launch` with a ready spare and a memory
snapshot every step; rank 0 (the rank that hosts the rendezvous and reports the steps)
is killed with SIGKILL while the ranks wait after step 15 (chaos pause_at_step: the
driver has recorded step 15), then the pause is released. The policy decides a warm restart, rank 1 keeps its process, the spare takes
rank 0 from rank 1's memory, at most one step is lost, and the lineage's losses are
the uninterrupted run's bit for bit."""

from __future__ import annotations

import pytest

import os
import signal

from tests.e2e.harness import LaunchedRun, kept_losses, pause_after, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow

WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1", pause_after(15)]


def test_a_killed_rank_is_replaced_by_the_spare_from_a_survivor_s_memory(tmp_path, reference_losses):
    # Its own local Ray: the spare needs a third CPU slot beside the two ranks.
    run = LaunchedRun(tmp_path / "warm", extra=WARM).start()
    status = run.wait_paused(15)
    os.kill(next(w["pid"] for w in status["workers"] if w["rank"] == 0), signal.SIGKILL)
    run.release(15)  # rank 1 goes on into step 16's collectives, finds its peer gone and waits
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    decision = next(e for e in events if e["type"] == "decision")
    assert decision["plan"]["warm"] is True and decision["plan"]["replace_ranks"] == [0]
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    evidence = start["evidence"]
    assert evidence["restart"] == "warm" and start["start_checkpoint"] is None
    assert start["start_step"] == 15 and evidence["steps_lost"] == 0
    workers = {e["subrun"]: {w["rank"]: w["pid"] for w in e["data"]["workers"]}
               for e in events if e["type"] == "event" and e["kind"] == "workers_started"}
    assert workers["1.01"][1] == workers["1.00"][1]  # the survivor kept its process
    assert workers["1.01"][0] != workers["1.00"][0]  # the spare took rank 0
    ends = {e["subrun"]: e["end_state"] for e in events if e["type"] == "subrun_end"}
    assert ends == {"1.00": "restarting", "1.01": "finished"}
    assert "warm from memory" in runmgr_text("logbook", "show", str(run.run_dir))


ZERO1 = ["parallel.use_distributed_optimizer=true"]


def test_a_killed_zero1_rank_is_replaced_from_its_buddy_s_copy_of_its_shard(tmp_path, shared_ray):
    # ZeRO-1: each rank holds half of AdamW's state, which no replica holds; its buddy (the other
    # rank) keeps a copy of its snapshot and is the donor. The unbroken run of the same config is
    # the reference (on the session's Ray: it needs no spare).
    unbroken = LaunchedRun(tmp_path / "unbroken", extra=[*ZERO1, f"cluster.address={shared_ray.address}"]).start()
    assert unbroken.wait() == 0, unbroken.output()[-3000:]
    run = LaunchedRun(tmp_path / "warm", extra=[*WARM, *ZERO1]).start()
    status = run.wait_paused(15)
    os.kill(next(w["pid"] for w in status["workers"] if w["rank"] == 1), signal.SIGKILL)
    run.release(15)
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == kept_losses(unbroken.run_dir)  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    decision = next(e for e in events if e["type"] == "decision")
    assert decision["plan"]["warm"] is True and decision["plan"]["replace_ranks"] == [1]
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    # The buddy's copy of step 15 arrived before the pause: at most the step in flight is lost.
    assert start["evidence"]["restart"] == "warm" and start["evidence"]["steps_lost"] <= 1
    workers = {e["subrun"]: {w["rank"]: w["pid"] for w in e["data"]["workers"]}
               for e in events if e["type"] == "event" and e["kind"] == "workers_started"}
    assert workers["1.01"][0] == workers["1.00"][0] and workers["1.01"][1] != workers["1.00"][1]
