"""What the launch's builders start (runmgr/wiring.py), checked without a cluster: the mid-run
device poll runs where there is an accelerator to read, or chaos scripts one, and not for
ranks on CPU, where it would only cost a Ray worker per node and one beside the driver. The
built-in trainer's ranks run under node agents, warm or not, on every device kind, and are read
by their agents (the poll folded into the agent: no poller actor beside them); a Megatron job's
node actors keep a poller on every node."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.chaos.build import Chaos
from runmgr.config.compose import load_run_config
from runmgr.wiring import build_runner, start_device_poll
from runmgr.workers.devicepoll import DevicePollGroup, DevicePollSettings

WARM = ("controller.warm_spares=1", "checkpoint.memory_interval=1")


@pytest.fixture
def started(monkeypatch) -> list[DevicePollGroup]:
    """The device poll groups whose pollers were started (no Ray: the start is only counted)."""
    groups: list[DevicePollGroup] = []
    monkeypatch.setattr(DevicePollGroup, "start", lambda self: groups.append(self))
    return groups


def config(tmp_path: Path, *overrides: str, chaos: str = "none"):
    return load_run_config("demo", [f"run.dir={tmp_path}", f"chaos={chaos}", "cluster.local_nodes=1", *overrides])


def agents_poll(run_config, chaos, device_kind: str):
    """How the runner's node agents read their nodes' devices (None: they do not)."""
    runner = build_runner(run_config, run_config.trainer_config(), device_kind, None, chaos)
    return runner.make_group().agents.device_poll


@pytest.mark.parametrize("device_kind", ["cuda", "npu"])
def test_an_accelerator_run_under_agents_has_its_agents_read_their_devices_and_no_poller(tmp_path, started,
                                                                                      device_kind):
    run_config = config(tmp_path)
    devices = start_device_poll(run_config, None, ["n1", "n2"], device_kind)
    assert started == [] and devices.drain() == []
    assert agents_poll(run_config, None, device_kind) == DevicePollSettings(run_config.health.poll_interval_s)


@pytest.mark.parametrize("device_kind", ["cuda", "npu"])
def test_a_warm_accelerator_run_is_under_agents_that_read_their_devices_with_no_poller(tmp_path, started,
                                                                                   device_kind):
    # Warm spares on accelerators are forked under the agents too (each with devices of its own):
    # no rank actor is left to poll beside them.
    run_config = config(tmp_path, *WARM)
    devices = start_device_poll(run_config, None, ["n1", "n2"], device_kind)
    assert started == [] and devices.drain() == []
    runner = build_runner(run_config, run_config.trainer_config(), device_kind, None, None)
    assert runner.make_group().ranks.agents.device_poll == DevicePollSettings(run_config.health.poll_interval_s)


@pytest.mark.parametrize("device_kind", ["cuda", "npu"])
def test_a_megatron_job_on_accelerators_polls_every_node(tmp_path, started, device_kind):
    devices = start_device_poll(config(tmp_path, "trainer.kind=megatron"), None, ["n1", "n2"], device_kind)
    assert started == [devices] and devices.node_ids == ["n1", "n2"]


def test_a_cpu_run_starts_no_poller_and_reads_nothing(tmp_path, started):
    run_config = config(tmp_path)
    devices = start_device_poll(run_config, None, ["n1"], "cpu")
    assert started == []
    assert devices.drain() == []
    devices.add_node("n2")  # a replacement node: still nothing to start
    devices.stop()
    assert started == []
    assert agents_poll(run_config, None, "cpu") is None


def test_a_cpu_run_whose_chaos_scripts_the_device_tools_has_its_agents_poll_them(tmp_path, started):
    run_config = config(tmp_path, chaos="opt_run12")  # its ECC fault writes an npu-smi that reports it
    chaos = Chaos(run_config, tmp_path)
    assert start_device_poll(run_config, chaos, ["n1"], "cpu") and started == []
    settings = agents_poll(run_config, chaos, "cpu")
    assert settings is not None and settings.path is not None and settings.path.startswith(str(chaos.tools_dir))


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_a_warm_run_whose_chaos_scripts_the_device_tools_has_its_agents_poll_them(tmp_path, started, device_kind):
    # Warm spares run under the node agents (runmgr/workers/warm_agents.py) on every device kind:
    # their agents read the scripted tools, as without spares, and no poller starts.
    run_config = config(tmp_path, *WARM, chaos="opt_run12")
    chaos = Chaos(run_config, tmp_path)
    assert start_device_poll(run_config, chaos, ["n1"], device_kind) and started == []
    runner = build_runner(run_config, run_config.trainer_config(), device_kind, None, chaos)
    settings = runner.make_group().ranks.agents.device_poll
    assert settings is not None and settings.path is not None and settings.path.startswith(str(chaos.tools_dir))


def test_a_megatron_job_whose_chaos_scripts_the_device_tools_has_its_poller_read_them(tmp_path, started):
    # A Megatron job's nodes are actors of their own, not agents: the poller reads the scripted tools.
    run_config = config(tmp_path, "trainer.kind=megatron", chaos="opt_run12")
    chaos = Chaos(run_config, tmp_path)
    devices = start_device_poll(run_config, chaos, ["n1"], "cuda")
    assert started == [devices] and devices.path is not None and devices.path.startswith(str(chaos.tools_dir))
