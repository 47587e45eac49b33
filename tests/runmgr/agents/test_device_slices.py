"""A node's device slices (runmgr/agents/device_slices.py), in-process: each live process holds a
slice of its own, by pid, so a spare renamed a rank keeps its devices; a slice is free again once
its holder is gone; with none free the next process is refused in the node's words."""

from __future__ import annotations

import pytest

from runmgr.agents.device_slices import DeviceSlices, NoFreeDevices, slices_for


def test_a_process_keeps_its_slice_whatever_rank_it_becomes_and_a_gone_ones_slice_is_reused():
    slices = DeviceSlices("n1", "cuda", ["4", "5", "6", "7", "8", "9"], per_process=2)
    for pid in (100, 101, 102):  # rank 0, rank 1, a spare
        slices.hold(slices.take({100, 101, 102} - {pid}, f"pid {pid}"), pid)
    assert slices.held() == {100: "4,5", 101: "6,7", 102: "8,9"}
    assert [slices.env(index) for index in range(3)] == [{"CUDA_VISIBLE_DEVICES": "4,5"},
                                                         {"CUDA_VISIBLE_DEVICES": "6,7"},
                                                         {"CUDA_VISIBLE_DEVICES": "8,9"}]
    # Rank 1 (pid 101) was killed and the spare (pid 102) named rank 1: the refill gets 101's slice.
    index = slices.take({100, 102}, "a warm spare")
    assert slices.env(index) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    slices.hold(index, 103)
    assert slices.held() == {100: "4,5", 103: "6,7", 102: "8,9"}


def test_a_node_with_every_slice_held_refuses_the_next_process_naming_the_holders():
    slices = DeviceSlices("n1", "npu", ["0", "1"], per_process=1)
    slices.hold(slices.take(set(), "rank 0"), 100)
    slices.hold(slices.take({100}, "rank 1"), 101)
    with pytest.raises(NoFreeDevices) as refused:
        slices.take({100, 101}, "a warm spare")
    assert str(refused.value) == ("node n1's agent holds 2 npu device(s) (0,1), 1 per process, every slice held by a "
                                  "live process (0 by pid 100, 1 by pid 101): no device for a warm spare")


def test_a_cpu_node_or_ranks_without_devices_have_no_slices():
    assert slices_for("n1", "cuda", ["0"], 0) is None and slices_for("n1", "cpu", None, 1) is None
