"""Which ranks a launch of the built-in trainer runs (runmgr/runners.py): forked by one node
agent per node on CPU nodes without warm spares, the agents kept across sub-runs until the
lineage ends; a Ray actor per rank with warm spares (their warm link) or on accelerators."""

from __future__ import annotations

from runmgr.config.compose import load_run_config
from runmgr.runners import builtin_runner
from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.workers.group import RayWorkerGroup
from runmgr.workers.warm_group import WarmRayWorkerGroup


def runner_of(tmp_path, device_kind: str, *overrides: str):
    config = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "chaos=none", *overrides])
    return builtin_runner(config, config.trainer_config(), device_kind, admitted_node_ids=None)


def test_cpu_ranks_without_warm_spares_are_forked_by_node_agents_that_serve_every_sub_run(tmp_path):
    runner = runner_of(tmp_path, "cpu")
    first, second = runner.make_group(), runner.make_group()
    assert isinstance(first, AgentWorkerGroup) and isinstance(second, AgentWorkerGroup)
    assert first.agents is second.agents, "one set of agents for the lineage: their servers keep the trainer imported"
    runner.close()  # nothing placed yet: nothing to end, and no Ray needed


def test_warm_spares_and_accelerators_keep_one_ray_actor_per_rank(tmp_path):
    warm = runner_of(tmp_path, "cpu", "controller.warm_spares=1", "checkpoint.memory_interval=1").make_group()
    assert isinstance(warm, WarmRayWorkerGroup)
    assert isinstance(runner_of(tmp_path, "cuda").make_group(), RayWorkerGroup)
    assert isinstance(runner_of(tmp_path, "npu").make_group(), RayWorkerGroup)
