"""The accelerators a local Ray would advertise, counted without torch or Ray."""

from __future__ import annotations

from runmgr.placement import local_accelerator_resources


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
