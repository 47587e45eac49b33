"""Warm restarts end to end: a real `runmgr launch` with one ready spare and a memory
snapshot every step, killed twice.

Rank 0 (the rank that hosts the rendezvous and reports the steps) is killed with SIGKILL
while the ranks wait after step 15 (chaos pause_at_step: the driver has recorded step 15),
then the pause is released: the policy decides a warm restart, rank 1 keeps its process,
the spare takes rank 0 from rank 1's memory. Once the re-formed group has stepped, a new
spare starts in the slot rank 0 left; the ranks wait again after step 25 until status.json
counts it ready, and rank 1 is killed: the new spare takes it from the first spare's
memory, warm again. No step is lost, and the lineage's losses are the uninterrupted run's
bit for bit. Under ZeRO-1 a killed rank is replaced from its buddy's copy of its shard."""

from __future__ import annotations

import pytest

import os
import signal

from tests.e2e.harness import LaunchedRun, kept_losses, pause_after, pauses_after, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow

WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1", pauses_after(15, 25)]
WARM_ONCE = ["controller.warm_spares=1", "checkpoint.memory_interval=1", pause_after(15)]
HALF_A_CPU = "cluster.cpus_per_worker=0.5"
"""On the session's Ray of 2 CPUs (tests/conftest.py: a killed rank is no reconfigured cluster),
the two ranks and the spare each reserve half a CPU: the spare needs a third slot beside the ranks.
Ray gives an actor of half a CPU one thread, as it does one of a whole CPU (OMP_NUM_THREADS=1), so
the losses stay those of the reference, whose ranks reserved a whole CPU each, bit for bit."""


def on_shared_ray(shared_ray) -> list[str]:
    """The overrides that put a warm run (two ranks and a spare) on the session's Ray."""
    return [f"cluster.address={shared_ray.address}", HALF_A_CPU]


def kill_rank(status: dict, rank: int) -> int:
    """SIGKILL the rank's process (status.json names it); its pid."""
    pid = next(w["pid"] for w in status["workers"] if w["rank"] == rank)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_two_killed_ranks_are_replaced_warm_by_the_spare_and_its_refill(tmp_path, reference_losses, shared_ray):
    run = LaunchedRun(tmp_path / "warm", extra=[*WARM, *on_shared_ray(shared_ray)]).start()
    run.wait_for(lambda s: s.get("ready_spares") == 1, what="the spare ready")
    kill_rank(run.wait_paused(15), 0)
    run.release(15)  # rank 1 goes on into step 16's collectives, finds its peer gone and waits
    status = run.wait_paused(25, index=1)
    assert status["subrun"] == "1.01"
    # The spare the recovery took is replaced in the background: wait for the new one, then kill again.
    status = run.wait_for(lambda s: s.get("ready_spares") == 1 and s["subrun"] == "1.01", what="the refilled spare")
    kill_rank(status, 1)
    run.release(25, index=1)
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    decisions = [e for e in events if e["type"] == "decision"]
    assert [(d["plan"]["warm"], d["plan"]["replace_ranks"]) for d in decisions] == [(True, [0]), (True, [1])]
    starts = {e["subrun"]: e for e in events if e["type"] == "subrun_start"}
    for subrun, step in (("1.01", 15), ("1.02", 25)):
        evidence = starts[subrun]["evidence"]
        assert evidence["restart"] == "warm" and starts[subrun]["start_checkpoint"] is None, subrun
        assert starts[subrun]["start_step"] == step and evidence["steps_lost"] == 0, subrun
    workers = {e["subrun"]: {w["rank"]: w["pid"] for w in e["data"]["workers"]}
               for e in events if e["type"] == "event" and e["kind"] == "workers_started"}
    assert workers["1.01"][1] == workers["1.00"][1]  # the survivor kept its process
    assert workers["1.01"][0] != workers["1.00"][0]  # the spare took rank 0
    assert workers["1.02"][0] == workers["1.01"][0]  # the first spare, now rank 0, kept its process
    assert workers["1.02"][1] not in (workers["1.01"][1], workers["1.00"][0])  # the refilled spare took rank 1
    spares = [(e["subrun"], e["kind"]) for e in events if e["type"] == "event" and e["kind"].startswith("spare_")]
    assert spares[:3] == [("1.00", "spare_ready"), ("1.01", "spare_refilling"), ("1.01", "spare_ready")], spares
    ends = {e["subrun"]: e["end_state"] for e in events if e["type"] == "subrun_end"}
    assert ends == {"1.00": "restarting", "1.01": "restarting", "1.02": "finished"}
    chronicle = runmgr_text("logbook", "show", str(run.run_dir))
    assert "warm from memory" in chronicle and "a new warm spare starts" in chronicle


ZERO1 = ["parallel.use_distributed_optimizer=true"]


def test_a_killed_zero1_rank_is_replaced_from_its_buddy_s_copy_of_its_shard(tmp_path, shared_ray):
    # ZeRO-1: each rank holds half of AdamW's state, which no replica holds; its buddy (the other
    # rank) keeps a copy of its snapshot and is the donor. The unbroken run of the same config is
    # the reference.
    unbroken = LaunchedRun(tmp_path / "unbroken", extra=[*ZERO1, f"cluster.address={shared_ray.address}"]).start()
    assert unbroken.wait() == 0, unbroken.output()[-3000:]
    run = LaunchedRun(tmp_path / "warm", extra=[*WARM_ONCE, *ZERO1, *on_shared_ray(shared_ray)]).start()
    run.wait_for(lambda s: s.get("ready_spares") == 1, what="the spare ready")
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
