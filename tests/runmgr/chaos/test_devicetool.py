"""The scripted npu-smi: read by the real device poll, broken on one node by chaos."""

from __future__ import annotations

import os
import subprocess

import pytest

from health.parsers import npu_smi
from runmgr.chaos.build import Chaos, build_chaos
from runmgr.chaos.devicetool import DeviceTools
from runmgr.config.compose import load_run_config
from runmgr.watch.device_readings import npu_readings
from runmgr.workers.devicepoll import tool_runner
from runmgr.config.watcher import WatcherConfig
from runmgr.watch.devices import DeviceDetector
from runmgr.watch.incidents import DEVICE_FAULT
from tests.runmgr.chaos.conftest import poll_of, running, step_report, worker_of


@pytest.fixture(autouse=True)
def no_ray_cluster(monkeypatch):
    """These tests stand for nodes of this host with made-up ids and no Ray cluster;
    a Ray another test left running in this process must not be asked about them."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)

NODE_A, NODE_B = "a" * 56, "b" * 56


def poll_node(tools_dir, node_id: str, monkeypatch) -> list:
    """One reading of the device poll's own code on ``node_id``, the tools directory first on PATH."""
    monkeypatch.setenv("RUNMGR_NODE_ID", node_id)
    run = tool_runner(10.0, f"{tools_dir}{os.pathsep}{os.environ['PATH']}")
    return npu_readings(run, node_id[:12], 1000.0)


def test_the_tool_prints_the_real_formats_of_a_healthy_npu(tmp_path):
    tool = DeviceTools(tmp_path / "tools").install()
    info = subprocess.run([str(tool), "info"], capture_output=True, text=True, check=True).stdout
    [chip] = npu_smi.parse_info(info).chips
    assert (chip.npu_id, chip.name, chip.health, chip.bus_id) == (0, "910B3", "OK", "0000:C1:00.0")
    health = subprocess.run([str(tool), "info", "-t", "health", "-i", "0"], capture_output=True, text=True).stdout
    assert [d.health for d in npu_smi.parse_health(health)] == ["OK"]
    ecc = subprocess.run([str(tool), "info", "-t", "ecc", "-i", "0"], capture_output=True, text=True).stdout
    assert npu_smi.parse_ecc(ecc).counts["hbm double bit error count"] == 0
    bad = subprocess.run([str(tool), "info", "-t", "ecc", "-i", "7"], capture_output=True, text=True)
    assert bad.returncode != 0


def test_a_broken_node_reports_uncorrectable_ecc_and_the_others_stay_clean(tmp_path, monkeypatch):
    tools = DeviceTools(tmp_path / "tools")
    tools.install()
    assert [r.uncorrectable for r in poll_node(tools.directory, NODE_A, monkeypatch) if r.kind == "ecc"] == [0]
    tools.break_node(NODE_A, raylet_pid=None)
    [ecc_a] = [r for r in poll_node(tools.directory, NODE_A, monkeypatch) if r.kind == "ecc"]
    [ecc_b] = [r for r in poll_node(tools.directory, NODE_B, monkeypatch) if r.kind == "ecc"]
    assert (ecc_a.node, ecc_a.uncorrectable, ecc_b.uncorrectable) == (NODE_A[:12], 2, 0)
    incidents = DeviceDetector(WatcherConfig().devices).update(ecc_a, 1000.0)
    assert [i.kind for i in incidents] == [DEVICE_FAULT] and incidents[0].nodes == (NODE_A[:12],)
    tools.heal_node(NODE_A)
    assert [r.uncorrectable for r in poll_node(tools.directory, NODE_A, monkeypatch) if r.kind == "ecc"] == [0]


def test_inside_ray_the_tool_knows_its_node_by_the_raylet_pid(tmp_path, monkeypatch):
    tools = DeviceTools(tmp_path / "tools")
    tools.install()
    tools.break_node(NODE_A, raylet_pid=4242)
    monkeypatch.delenv("RUNMGR_NODE_ID", raising=False)
    env = dict(os.environ, RAY_RAYLET_PID="4242")
    out = subprocess.run([str(tools.directory / "npu-smi"), "info", "-t", "ecc", "-i", "0"], env=env,
                         capture_output=True, text=True).stdout
    assert npu_smi.parse_ecc(out).counts["hbm double bit error count"] == 2
    env["RAY_RAYLET_PID"] = "4243"
    out = subprocess.run([str(tools.directory / "npu-smi"), "info", "-t", "ecc", "-i", "0"], env=env,
                         capture_output=True, text=True).stdout
    assert npu_smi.parse_ecc(out).counts["hbm double bit error count"] == 0


def test_the_device_ecc_fault_breaks_the_node_of_its_rank(tmp_path, sleeper, monkeypatch):
    chaos = build_chaos(load_run_config("demo", [f"run.dir={tmp_path}", "chaos=device_ecc"]))
    assert chaos.prepare() == [] and chaos.tools_dir is not None
    assert chaos.device_path("/usr/bin") == f"{chaos.tools_dir}{os.pathsep}/usr/bin"
    seen = []
    injector = chaos.injector(seen.append)
    state = running([worker_of(0, sleeper(), NODE_A), worker_of(1, sleeper(), NODE_B)])
    injector.on_transition(None, state)
    injector.on_poll(state, poll_of(step_report(30)))
    assert seen[0].kind == "device_ecc" and NODE_B[:12] in seen[0].target
    assert [r.uncorrectable for r in poll_node(chaos.tools_dir, NODE_B, monkeypatch) if r.kind == "ecc"] == [2]
    assert [r.uncorrectable for r in poll_node(chaos.tools_dir, NODE_A, monkeypatch) if r.kind == "ecc"] == [0]


def test_a_device_fault_with_a_duration_heals_when_it_is_over(tmp_path, sleeper, monkeypatch):
    now = [1000.0]
    faults = "chaos.faults=[{kind: device_ecc, at_step: 3, duration_s: 60}]"
    config = load_run_config("demo", [f"run.dir={tmp_path}", faults])
    chaos = Chaos(config, tmp_path, clock=lambda: now[0])
    chaos.prepare()
    injector = chaos.injector(lambda i: None)
    state = running([worker_of(0, sleeper(), NODE_A)])
    injector.on_transition(None, state)
    injector.on_poll(state, poll_of(step_report(3)))
    assert [r.uncorrectable for r in poll_node(chaos.tools_dir, NODE_A, monkeypatch) if r.kind == "ecc"] == [2]
    now[0] += 61
    injector.on_poll(state, poll_of(step_report(4)))
    assert [r.uncorrectable for r in poll_node(chaos.tools_dir, NODE_A, monkeypatch) if r.kind == "ecc"] == [0]
