"""Real node agents (runmgr/workers/node_agent.py) under the agent group, on a real local Ray:
the agent forks the trainer's ranks from its node's fork server, and the driver's group hears
them through one drain per poll: every step and checkpoint of a run to its end, and a rank
killed in the middle as a death with its signal; stopping the group leaves no rank behind; the
agent reads its node's devices, and ends its ranks and itself once its driver is gone.

Two sets of agents for the module (each per node a Ray worker and a fork server that imports the
trainer, most of what a test here costs): the tests that end no agent follow one another on one
set as a lineage's sub-runs do (:func:`lineage_agents`), and the device read and the lost driver
are two parts of one set's life; until issue 28 each of the five tests started a set of its own."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from ray.exceptions import RayActorError

from runmgr.config.schema import ClusterConfig
from runmgr.config.watcher import DeviceConfig
from runmgr.controller.group import GroupPoll
from runmgr.watch.deaths import classify
from runmgr.watch.devices import DeviceDetector
from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.workers.devicepoll import DevicePollSettings
from runmgr.workers.lease import DriverIdentity, process_start_ticks
from runmgr.workers.ray_node_agents import RayNodeAgents
from runmgr.workers.proctree import alive
from tests.e2e.harness import pid_gone
from tests.runmgr.agents.configs import tiny_config
from trainer.plan import ResumePlan

ITERS = 6


def tiny(save: Path, iters: int = ITERS):
    return tiny_config(save, iters, save_interval=3)


CPUS_HELD = 2 * 0.5
"""What one set of the module's agents holds while it lives (:func:`node_agents`: 2 nodes of 0.5 CPU)."""
_lineage_held = [0.0]
"""The CPUs :func:`lineage_agents` holds while it lives: the per-test check leaves them out."""


def wait_released(local_ray, held: float = 0.0) -> None:
    """Until the session's Ray has every CPU but ``held`` free again: killing the agents and
    removing their placement group take effect after the calls return, and the next test on this
    Ray (tests/runmgr/workers/test_placing.py) reads what is free."""
    deadline = time.monotonic() + 60
    while local_ray.available_resources().get("CPU", 0.0) + held < local_ray.cluster_resources().get("CPU", 0.0):
        assert time.monotonic() < deadline, f"still held: {local_ray.available_resources()}"
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def all_released(local_ray):
    """After each test, every CPU free again but those the module's lineage agents hold."""
    yield
    wait_released(local_ray, _lineage_held[0])


@pytest.fixture(scope="module")
def lineage_agents(local_ray):
    """One set of agents for the tests that end none (a run to its end, a rank killed under its
    agent, a second sub-run), which follow one another on them as a lineage's sub-runs do: the
    agents live across sub-runs. Started once for the three, where each started a set of its own
    (per node a Ray worker and a fork server that imports the trainer: about 2.5-3 CPU-seconds)."""
    nodes = node_agents()
    _lineage_held[0] = CPUS_HELD
    try:
        yield nodes
    finally:
        nodes.close()
        _lineage_held[0] = 0.0
        wait_released(local_ray)


def node_agents() -> RayNodeAgents:
    return RayNodeAgents(ClusterConfig(num_workers=2, cpus_per_worker=0.5), "cpu", start_timeout_s=60,
                         push_interval_s=0.2)


def group(agents: RayNodeAgents | None = None) -> AgentWorkerGroup:
    return AgentWorkerGroup(agents or node_agents(), default_world=2)


def poll_until(agents: AgentWorkerGroup, done, timeout_s: float = 120) -> list[GroupPoll]:
    polls, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        polls.append(agents.poll(0.5))
        if done(polls):
            return polls
    raise AssertionError(f"not done within {timeout_s} s: {polls[-3:]}")


def test_a_run_under_real_agents_reports_every_step_and_checkpoint_to_the_end(lineage_agents, tmp_path):
    agents = group(lineage_agents)
    try:
        workers = agents.start(tiny(tmp_path / "ckpt"), ResumePlan(subrun="1.00"))
        assert [w.rank for w in workers] == [0, 1] and len({w.pid for w in workers}) == 2
        polls = poll_until(agents, lambda polls: sum(len(p.finished_ranks) for p in polls) == 2)
    finally:
        agents.shutdown()
    assert sorted(rank for p in polls for rank in p.finished_ranks) == [0, 1]
    assert [f for p in polls for f in p.failures] == []
    assert [s.step for p in polls for s in p.steps] == list(range(1, ITERS + 1))
    assert [c.step for p in polls for c in p.checkpoints] == [3, 6]
    (start,) = [s for p in polls for s in p.starts]  # rank 0's: what the sub-run really started with
    assert (start.subrun, start.start_step, start.resumed_from) == ("1.00", 0, None)
    assert all(not alive(w.pid) for w in workers)


def test_a_rank_killed_under_its_agent_is_a_death_and_the_stop_leaves_no_rank(lineage_agents, tmp_path):
    agents = group(lineage_agents)
    try:
        workers = agents.start(tiny(tmp_path / "ckpt", iters=10_000), ResumePlan(subrun="1.00"))
        poll_until(agents, lambda polls: any(p.steps for p in polls))
        agents.kill(1)
        polls = poll_until(agents, lambda polls: any(p.failures for p in polls))
        failure = next(f for p in polls for f in p.failures)
        assert (failure.rank, failure.kind, failure.exit_code) == (1, "died", -9) and "SIGKILL" in failure.text
        assert failure.worker is not None and failure.worker.pid == workers[1].pid
    finally:
        agents.shutdown()
    assert all(not alive(w.pid) for w in workers)


def test_the_next_sub_run_is_served_by_the_same_agents_and_resumes_where_the_last_stopped(lineage_agents, tmp_path):
    """Agents live across sub-runs: the second sub-run's ranks are new processes, forked by the
    same agents (their servers have the trainer imported), and resume from the first's checkpoint."""
    nodes = lineage_agents
    save = tmp_path / "ckpt"
    first = group(nodes)
    try:
        first.start(tiny(save, iters=3), ResumePlan(subrun="1.00"))
        poll_until(first, lambda polls: sum(len(p.finished_ranks) for p in polls) == 2)
        agent_pids = ray_get_pids(nodes)
        first_pids = {w.pid for w in first.workers}
    finally:
        first.shutdown()
    second = group(nodes)
    try:
        workers = second.start(tiny(save), ResumePlan(subrun="1.01", start_checkpoint=str(save / "step_00000003")))
        polls = poll_until(second, lambda polls: sum(len(p.finished_ranks) for p in polls) == 2)
    finally:
        second.shutdown()
    assert ray_get_pids(nodes) == agent_pids
    assert {w.pid for w in workers}.isdisjoint(first_pids)
    assert [s.step for p in polls for s in p.steps] == [4, 5, 6]
    (start,) = [s for p in polls for s in p.starts]
    assert (start.subrun, start.start_step) == ("1.01", 3)


def test_the_agent_reads_its_nodes_devices_then_with_its_driver_gone_ends_its_ranks_in_their_own_words(
        local_ray, tmp_path, ascend, child):
    """One agent set's life in two parts (one set, where each part started one of its own: a Ray
    worker and a fork server that imports the trainer per node).

    The device poll folded into the agent: no poller actor beside the ranks; the agent reads its
    node's npu-smi (the tests' scripted one) and its readings come with the one drain per poll.
    An uncorrectable ECC error that appears mid-run is read and is an incident naming the node,
    while the ranks train on.

    The agent holds its ranks' lease: once the driver's process is gone it pushes each running
    rank's end as that rank stopping itself (a ``driver_lost`` death for a driver that may only be
    silent), ends the ranks and itself."""
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid,
                     start_ticks=process_start_ticks(child.pid))
    nodes = RayNodeAgents(ClusterConfig(num_workers=2, cpus_per_worker=0.5), "cpu", start_timeout_s=60,
                          push_interval_s=0.2, lease_s=1.0, driver=driver,
                          device_poll=DevicePollSettings(0.2, path=ascend.path))
    agents = group(nodes)
    try:
        # No checkpoint in the test: a rank would stop itself at its commit check first (test_lease.py),
        # and its peer end with the broken collective's words; here the agent's lease alone acts.
        config = tiny_config(tmp_path / "ckpt", 10_000, save_interval=100_000)
        workers = agents.start(config, ResumePlan(subrun="1.00"))
        places = nodes.place(2, ())
        healthy = poll_until(agents, lambda polls: any(p.steps for p in polls) and ecc_readings(polls))
        assert all(r.uncorrectable == 0 for r in ecc_readings(healthy))
        ascend.set_ecc(1, single=3, double=2)  # after healthy readings came: the next read shows it
        polls = poll_until(agents, lambda polls: [r for r in ecc_readings(polls) if r.uncorrectable])
        broken = min((r for r in ecc_readings(polls) if r.uncorrectable), key=lambda r: r.time)
        node = local_ray.get_runtime_context().get_node_id()[:12]
        assert (broken.node, broken.device, broken.uncorrectable) == (node, 1, 2)
        assert [p.failures for p in polls if p.failures] == []  # the ranks trained on meanwhile
        incidents = DeviceDetector(DeviceConfig()).update(broken, broken.time)
        assert [i.nodes for i in incidents] == [(node,)]

        child.kill()
        child.wait()
        polls = poll_until(agents, lambda polls: sum(len(p.failures) for p in polls) == 2)
        failures = sorted((f for p in polls for f in p.failures), key=lambda f: f.rank)
        assert [(f.rank, f.kind) for f in failures] == [(0, "error"), (1, "error")]
        for failure, worker in zip(failures, workers):
            assert f"runmgr worker {worker.pid} (rank {worker.rank}) stopped itself: its driver (pid " \
                   f"{child.pid}, on this machine) is gone" in failure.text
            assert classify(failure.text).category == "driver_lost"
        assert all(pid_gone(w.pid, timeout=10) for w in workers)
        assert all(agent_ends(place, within_s=30) for place in places)
    finally:
        agents.shutdown()
        nodes.close()


def agent_ends(place, within_s: float) -> bool:
    """Whether the agent of ``place`` ends within ``within_s`` (it checks its lease twice a second)."""
    import ray

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(place.where.pid.remote(), timeout=within_s)
        except RayActorError:
            return True
        time.sleep(0.1)
    return False


def ray_get_pids(nodes: RayNodeAgents) -> list[int]:
    import ray

    return ray.get([place.where.pid.remote() for place in nodes.place(2, ())])


def ecc_readings(polls: list[GroupPoll]) -> list:
    return [r for p in polls for r in p.devices if r.kind == "ecc"]
