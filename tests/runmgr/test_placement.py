"""The accelerators a local Ray would advertise, counted without torch or Ray; the devices a node
agent hands each of its forked ranks."""

from __future__ import annotations

import pytest

from runmgr.placement import local_accelerator_resources, rank_device_env


def _machine(root, gpus: int = 0, npus: int = 0):
    for index in range(gpus):
        (root / "proc/driver/nvidia/gpus" / f"0000:{index:02x}:00.0").mkdir(parents=True)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for index in range(npus):
        (root / "dev" / f"davinci{index}").touch()
    (root / "dev" / "davinci_manager").touch()  # Ascend's management device, not an NPU
    return str(root)


def test_a_cpu_machine_has_no_accelerator(tmp_path):
    assert local_accelerator_resources({}, _machine(tmp_path)) == {}


def test_the_devices_the_drivers_list_are_counted(tmp_path):
    root = _machine(tmp_path, gpus=8)
    assert local_accelerator_resources({}, root) == {"GPU": 8.0}
    assert local_accelerator_resources({}, _machine(tmp_path / "ascend", npus=16)) == {"NPU": 16.0}


def test_the_visible_devices_variable_narrows_them_as_it_does_for_ray(tmp_path):
    root = _machine(tmp_path, gpus=8, npus=8)
    env = {"CUDA_VISIBLE_DEVICES": "0,3", "ASCEND_RT_VISIBLE_DEVICES": ""}
    assert local_accelerator_resources(env, root) == {"GPU": 2.0}


def test_each_of_a_nodes_ranks_gets_its_own_share_of_its_agents_devices_in_rays_variable():
    ids = ["4", "5", "6", "7"]  # what Ray gave the agent of a node of two ranks of two devices
    assert [rank_device_env("cuda", ids, 2, index) for index in (0, 1)] == [
        {"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    assert rank_device_env("npu", ["0", "1"], 1, 1) == {"ASCEND_RT_VISIBLE_DEVICES": "1"}


def test_a_cpu_rank_or_one_without_devices_is_given_no_variable():
    assert rank_device_env("cpu", [], 0, 1) == {}
    assert rank_device_env("cuda", ["0", "1"], 0, 1) == {}


def test_an_agent_holding_too_few_devices_for_a_rank_is_refused_not_left_seeing_others():
    with pytest.raises(ValueError, match="holds 1 cuda device.*too few for its rank #2 of 1 each"):
        rank_device_env("cuda", ["3"], 1, 1)
