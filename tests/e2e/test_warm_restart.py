"""Warm restarts end to end: a real `runmgr launch` under ZeRO-1 with one ready spare and a
memory snapshot every step, killed twice.

Under ZeRO-1 each rank holds half of AdamW's state, which no replica holds: a killed rank is
replaced from its buddy's copy of its snapshot (the other rank's memory). Rank 0 (the rank that
hosts the rendezvous and reports the steps) is killed with SIGKILL while the ranks wait after step
15 (chaos pause_at_step: the driver has recorded step 15), then the pause is released: the policy
decides a warm restart, rank 1 keeps its process, the spare takes rank 0 from rank 1's copy. Once
the re-formed group has stepped, a new spare starts in the slot rank 0 left; the ranks wait again
after step 25 until status.json counts it ready, and rank 1 is killed: the new spare takes it from
the first spare's copy (the buddies' exchange resumed in the re-formed group), warm again. At
most a step in flight is lost, and the lineage's losses are the unbroken ZeRO-1 run's bit for bit.

Plain data parallel's warm restart (a replica's live state, no step lost) is
tests/e2e/test_resharding_resume.py's warm story, through real agents on two nodes; until issue
28 this module also ran it on one node, a launch of its own (docs/testing.md, "End-to-end tests
removed or merged")."""

from __future__ import annotations

import pytest

import os
import signal

from tests.e2e.harness import LaunchedRun, kept_losses, pauses_after, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow

WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1", pauses_after(15, 25)]
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


ZERO1 = ["parallel.use_distributed_optimizer=true"]
"""ZeRO-1: each rank holds half of AdamW's state, which no replica holds; its buddy (the other rank)
keeps a copy of its snapshot and is the donor."""


@pytest.fixture(scope="module")
def zero1_unbroken(tmp_path_factory, shared_ray) -> dict[int, float]:
    """The kept losses of the unbroken run of the ZeRO-1 config, the warm run's reference (the
    session's reference run is plain data parallel, whose clipping norm sums in another order)."""
    unbroken = LaunchedRun(tmp_path_factory.mktemp("zero1") / "unbroken",
                           extra=[*ZERO1, f"cluster.address={shared_ray.address}"]).start()
    assert unbroken.wait() == 0, unbroken.output()[-3000:]
    return kept_losses(unbroken.run_dir)


def test_two_killed_zero1_ranks_are_replaced_warm_by_the_spare_and_its_refill_from_their_buddies(
        tmp_path, zero1_unbroken, shared_ray):
    run = LaunchedRun(tmp_path / "warm", extra=[*WARM, *ZERO1, *on_shared_ray(shared_ray)]).start()
    run.wait_for(lambda s: s.get("ready_spares") == 1, what="the spare ready")
    kill_rank(run.wait_paused(15), 0)
    run.release(15)  # rank 1 goes on into step 16's collectives, finds its peer gone and waits
    status = run.wait_paused(25, index=1)
    assert status["subrun"] == "1.01"
    # The spare the recovery took is replaced in the background: wait for the new one, then kill again.
    status = run.wait_for(lambda s: s.get("ready_spares") == 1 and s["subrun"] == "1.01", what="the refilled spare")
    kill_rank(status, 1)  # its shard's copy is in the first spare's memory, its buddy since 1.01
    run.release(25, index=1)
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == zero1_unbroken  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    decisions = [e for e in events if e["type"] == "decision"]
    assert [(d["plan"]["warm"], d["plan"]["replace_ranks"]) for d in decisions] == [(True, [0]), (True, [1])]
    starts = {e["subrun"]: e for e in events if e["type"] == "subrun_start"}
    for subrun, step in (("1.01", 15), ("1.02", 25)):
        evidence = starts[subrun]["evidence"]
        assert evidence["restart"] == "warm" and starts[subrun]["start_checkpoint"] is None, subrun
        # A buddy's copy of the paused step may still be in flight: at most that step is lost (a
        # replica's live state loses none: tests/e2e/test_resharding_resume.py's warm story).
        assert evidence["steps_lost"] <= 1 and starts[subrun]["start_step"] == step - evidence["steps_lost"], subrun
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
