"""Which ranks a launch of the built-in trainer runs (runmgr/runners.py): forked by one node
agent per node, warm or not, on CPU and accelerator nodes alike (with warm spares the warm part
holds the agent group), the agents kept across sub-runs until the lineage ends. The per-rank
design is left to the benches, cold only."""

from __future__ import annotations

import pytest

from runmgr.config.compose import load_run_config
from runmgr.runners import builtin_runner, per_rank_runner
from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.workers.warm_agents import WarmAgentGroup


def runner_of(tmp_path, device_kind: str, *overrides: str):
    config = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "chaos=none", *overrides])
    return builtin_runner(config, config.trainer_config(), device_kind, admitted_node_ids=None)


@pytest.mark.parametrize("device_kind", ["cpu", "cuda", "npu"])
def test_ranks_without_warm_spares_are_forked_by_node_agents_that_serve_every_sub_run(tmp_path, device_kind):
    runner = runner_of(tmp_path, device_kind)
    first, second = runner.make_group(), runner.make_group()
    assert isinstance(first, AgentWorkerGroup) and isinstance(second, AgentWorkerGroup)
    assert first.agents is second.agents, "one set of agents for the lineage: their servers keep the trainer imported"
    assert first.agents.device_kind == device_kind  # which devices the agents hold and hand their ranks
    runner.close()  # nothing placed yet: nothing to end, and no Ray needed


@pytest.mark.parametrize("device_kind", ["cpu", "cuda", "npu"])
def test_warm_spares_run_under_the_node_agents_through_the_warm_part_on_every_device_kind(tmp_path, device_kind):
    runner = runner_of(tmp_path, device_kind, "controller.warm_spares=1", "checkpoint.memory_interval=1")
    first, second = runner.make_group(), runner.make_group()
    assert isinstance(first, WarmAgentGroup) and isinstance(first.ranks, AgentWorkerGroup)
    assert first.ranks.agents is second.ranks.agents  # the lineage's agents, as without spares
    assert first.ranks.agents.device_kind == device_kind  # spares get devices of their own from them
    runner.close()


def test_the_per_rank_design_left_to_the_benches_refuses_warm_spares(tmp_path):
    config = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "chaos=none", "controller.warm_spares=1",
                                      "checkpoint.memory_interval=1"])
    with pytest.raises(ValueError, match="warm spares run under node agents only"):
        per_rank_runner(config, config.trainer_config(), "cuda", None, lambda: None)
