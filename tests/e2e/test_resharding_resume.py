"""A node lost on a real local Ray of two nodes, two stories on the module's one Ray:
without a spare the run resumes resharded at data parallel 2; with a warm spare the lost
node's rank is replaced warm by the spare on the other node, through the real node agents.

**Resharding resume** (issue 14, must-show 2): a data-parallel 4 run with
the distributed optimizer (ZeRO-1: each rank holds a quarter of AdamW's state) on two
two-rank nodes of a real local Ray loses a node with no spare, and the next sub-run
continues at data parallel 2 from the DP 4 checkpoint (DCP reshards the optimizer
state into halves), to the end.

The moment comes from the run's own state: the chaos schedule kills rank 1 once the
run reached step :data:`KILL_AT` (``kill_worker``), and the policy takes a killed
worker's node out (``policy.death_actions.killed=exclude_node``). The node left holds
two ranks; the global batch (8 samples of micro-batch 2) divides by data parallel 4, 2
or 1, so the policy picks 2 and gradient accumulation keeps the global batch (1
micro-batch per replica per step at DP 4, 2 at DP 2). (tests/runmgr/policy/test_capacity.py
covers the sizes the batch forbids: 3 ranks left give DP 2, too.)

The reference is the session's unbroken run of the e2e config (``reference_losses``,
tests/conftest.py: data parallel 2 without the distributed optimizer, the same 8 samples
a step, the same 40 steps and so the same LR schedule), not a DP 4 run of its own. The
resized run's kept losses (steps 1-10 from the first sub-run at DP 4, 11-40 recomputed at
DP 2 from the step-10 checkpoint) equal it up to the order of the float sums: the gradient
of a step is the same mean over the same 8 samples (at DP 4 summed over 4 replicas of 1
micro-batch, the reference's over 2 replicas of 2), and AdamW's update is elementwise, the
same whether a rank holds a shard of its state or all of it. A shard loaded into the
wrong rank, or a replay of the wrong samples, moves the loss by far more. Measured on
this machine: the largest relative loss difference over the 40 steps is 4.7e-07 (step 33;
float32 rounding); the test allows :data:`TOLERANCE` = 1e-5.

**A node lost under the node agents, warm** (issue 29, docs/scale.md "Warm spares on agents"):
the e2e config (two ranks) with one warm spare and a memory snapshot every step, placed
SPREAD: rank 0 and rank 1 on different nodes, the spare on the head, the only node with room
for a second bundle (:data:`WARM_CPUS`). Every rank waits after step :data:`KILL_AT`; the other
node is killed whole (its rank, the agent's fork server, the agent and the raylet, SIGKILL),
then the pause is released. The survivor's collective fails and it waits in its warm link; the
driver's lost-node probe asks each node's agent (one call per node) and the lost node's raylet,
and names the node's rank lost before Ray declares the node dead; the policy excludes the node
and decides a warm restart; the spare on the head takes the lost rank from the survivor's
memory; no new spare is forked on the excluded node; the run ends with the unbroken run's
losses bit for bit. It runs after the resharding story (it asks for its fixture): the node it
kills is gone for the rest of the module.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from runmgr.cluster import LocalCluster
from runmgr.config.schema import ClusterConfig
from runmgr.nodes import node_name
from tests.e2e.harness import E2E_OVERRIDES, LaunchedRun, kept_losses, pause_after, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow

STEPS = 40
"""The reference run's steps (E2E_OVERRIDES)."""
KILL_AT = 15
HEAD_CPUS, NODE_CPUS = 4, 3
RESHARD_CPUS, WARM_CPUS = 1.5, 1.75
"""The nodes' CPUs and each run's ranks' (Ray's count, not this machine's cores). The resharding
run's four bundles of 1.5 fill two on each node whichever node Ray packs first; the warm run's
three bundles of 1.75 fit two on the head and one on the other node, so SPREAD puts rank 0 and
rank 1 on different nodes and the spare on the head. Both under 2 CPUs: one thread per rank
(``OMP_NUM_THREADS``), as the reference's ranks of 1 CPU, so the warm run's losses are the
reference's bit for bit."""
TOLERANCE = 1e-5
"""Largest relative difference allowed between the resized and the unbroken run's losses."""
BASE = [*E2E_OVERRIDES, "cluster.num_workers=4", f"cluster.cpus_per_worker={RESHARD_CPUS}",
        "parallel.use_distributed_optimizer=true"]
# The ranks wait after KILL_AT until the kill (the pause fires once a lineage: the next sub-run passes
# it): without it a fast machine's ranks saved checkpoint 20 before the driver saw step 15 and killed.
RESIZED = [f"chaos.faults=[{{kind: pause_at_step, at_step: {KILL_AT}}}, {{kind: kill_worker, at_step: {KILL_AT}, rank: 1}}]",
           "policy.death_actions.killed=exclude_node"]


@pytest.fixture(scope="module")
def two_nodes():
    """The module's local Ray: the head of :data:`HEAD_CPUS` CPUs and one node of :data:`NODE_CPUS`."""
    cluster = LocalCluster(ClusterConfig(local_nodes=2, cpus_per_worker=NODE_CPUS), head_cpus=HEAD_CPUS)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def resized(tmp_path_factory, two_nodes) -> Path:
    """The resized run, on the module's two nodes (two ranks on each, no spare); its run directory."""
    run = LaunchedRun(tmp_path_factory.mktemp("reshard") / "resized",
                      extra=[f"cluster.address={two_nodes.address}", *RESIZED], base=BASE).start()
    assert run.wait(timeout=900) == 0, run.output()[-3000:]
    return run.run_dir


def events_of(run_dir: Path) -> list[dict]:
    return runmgr_json_lines("logbook", "events", str(run_dir), "--json")


def test_a_lost_node_without_spare_continues_at_data_parallel_2_to_the_end(resized):
    events = events_of(resized)
    starts = [e for e in events if e["type"] == "subrun_start"]
    assert [s["plan"]["data_parallel_size"] for s in starts] == [4, 2]
    decision = next(e for e in events if e["type"] == "decision" and e["action"] == "exclude_node")
    assert "data parallel shrinks 4 -> 2: the nodes left hold 2 rank(s)" in decision["reason"], decision["reason"]
    assert starts[1]["start_step"] == 10  # the DP 4 run's checkpoint, loaded at DP 2
    started = [len(e["data"]["workers"]) for e in events if e["type"] == "event" and e["kind"] == "workers_started"]
    assert started == [4, 2]
    ends = [e for e in events if e["type"] == "subrun_end"]
    assert ends[-1]["end_state"] == "finished" and ends[-1]["last_step"] == STEPS


def test_each_sub_run_s_start_shows_its_layout_and_the_logbook_the_change(resized):
    events = events_of(resized)
    effective = [e["data"] for e in events if e["type"] == "event" and e["kind"] == "effective_settings"]
    assert [(e["layout"], e["data_parallel_size"], e["accumulation_steps"]) for e in effective] == [
        ("dp 4 x tp 1 x pp 1, zero1", 4, 1), ("dp 2 x tp 1 x pp 1, zero1", 2, 2)]
    shown = runmgr_text("logbook", "show", str(resized))
    assert "data parallel 4 → 2" in shown, shown


def test_the_resized_run_s_losses_are_those_of_the_unbroken_run(resized, reference_losses):
    rows = runmgr_json_lines("logbook", "metrics", str(resized), "--json")
    kept = {row["step"]: row["loss"] for row in rows}
    assert sorted(kept) == sorted(reference_losses) == list(range(1, STEPS + 1))
    # Steps 1-10 are the DP 4 sub-run's, up to its checkpoint; 11 on were recomputed at DP 2.
    assert {row["step"]: row["subrun"] for row in rows} == {step: "1.00" if step <= 10 else "1.01"
                                                            for step in range(1, STEPS + 1)}
    differences = {step: abs(kept[step] - reference_losses[step]) / abs(reference_losses[step]) for step in kept}
    print(f"largest relative loss difference, DP 4 -> 2 at step 10 vs unbroken DP 2: "
          f"{max(differences.values()):.3g} (step {max(differences, key=differences.get)})")
    assert max(differences.values()) <= TOLERANCE, differences


WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1", pause_after(KILL_AT),
        f"cluster.cpus_per_worker={WARM_CPUS}", "cluster.placement_strategy=SPREAD"]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_node_of(pid: int) -> list[int]:
    """SIGKILL a forked rank's node whole: the rank and its ancestors up to its node's raylet (the
    agent's fork server, the agent, the raylet); their pids."""
    line = [pid]
    while Path(f"/proc/{line[-1]}/comm").read_text().strip() != "raylet":
        line.append(_parent(line[-1]))
        assert line[-1] > 1, f"rank pid {pid} has no raylet among its ancestors ({line})"
    for victim in line:
        os.kill(victim, signal.SIGKILL)
    return line


def test_a_node_lost_under_its_agent_is_named_and_its_rank_replaced_warm_by_the_spare_on_the_other_node(
        resized, two_nodes, tmp_path, reference_losses):
    run = LaunchedRun(tmp_path / "warm", extra=[f"cluster.address={two_nodes.address}", *WARM]).start()
    run.wait_for(lambda s: s.get("ready_spares") == 1, what="the spare ready")
    status = run.wait_paused(KILL_AT)
    head = two_nodes.head_node.node_id
    (lost,) = [w for w in status["workers"] if w["node"] != head]  # one rank on each node
    (survivor,) = [w for w in status["workers"] if w["node"] == head]
    kill_node_of(lost["pid"])
    run.release(KILL_AT)
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses  # exact float equality, every step
    events = events_of(run.run_dir)
    lost_node = node_name(lost["node"])
    # One incident: the node's rank, named by the driver's probe through the agents and the raylet
    # check, not by Ray's later word that the node (and so its agent) died.
    (incident,) = [e for e in events if e["type"] == "incident"]
    assert incident["ranks"] == [lost["rank"]] and incident["nodes"] == [lost_node], incident
    found = incident["evidence"]["evidence"]
    assert found["cause"] == "node_lost" and found["category"] == "node", incident
    assert f"while rank(s) {survivor['rank']} wait for a lost peer" in found["line"], found["line"]
    assert "found by the driver's probe before Ray declared the node dead" in found["line"], found["line"]
    (decision,) = [e for e in events if e["type"] == "decision"]
    assert decision["action"] == "exclude_node" and decision["plan"]["exclude_nodes"] == [lost_node], decision
    assert decision["plan"]["warm"] is True and decision["plan"]["replace_ranks"] == [lost["rank"]], decision
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["evidence"]["restart"] == "warm" and start["start_checkpoint"] is None
    assert start["start_step"] == KILL_AT and start["evidence"]["steps_lost"] == 0
    workers = {e["subrun"]: {w["rank"]: w for w in e["data"]["workers"]}
               for e in events if e["type"] == "event" and e["kind"] == "workers_started"}
    spares = [e for e in events if e["type"] == "event" and e["kind"].startswith("spare_")]
    ready = next(e for e in spares if e["kind"] == "spare_ready")
    replaced = workers["1.01"][lost["rank"]]
    assert replaced["node"] == head and replaced["pid"] == ready["data"]["worker"]["pid"]  # the spare, warm
    assert workers["1.01"][survivor["rank"]]["pid"] == survivor["pid"]  # the survivor kept its process
    # No new spare in the slot the lost rank left: it is on the excluded node.
    assert [e["kind"] for e in spares] == ["spare_ready", "spare_not_refilled"], spares
    assert f"the slot rank {lost['rank']} left is on node {lost_node}, which the plan avoids" in spares[1]["message"]
    ends = {e["subrun"]: e["end_state"] for e in events if e["type"] == "subrun_end"}
    assert ends == {"1.00": "restarting", "1.01": "finished"}
