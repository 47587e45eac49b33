"""What each runtime fault does to the run's real processes and files.

Every function acts for real and returns one line for the logbook. The
process faults run on the target's own node (:mod:`runmgr.chaos.nodes`); the
functions handed to a node runner are module-level so that Ray can ship them.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from runmgr.chaos import procfault, storage
from runmgr.chaos.devicetool import DeviceTools
from runmgr.chaos.nodes import NodeRunner, RayNodeRunner, raylet_pid, runner_for
from runmgr.config.chaos import CHECKPOINT_FAIL, DEVICE_ECC, HANG_RANK, KILL_WORKER, SLOW_RANK, FaultSpec

if TYPE_CHECKING:  # the actor module imports ray; chaos only reads the fields
    from runmgr.controller.group import WorkerInfo

HANG_SAFETY_S = 600.0
"""A stopped rank is resumed after this long if nobody killed it (default of duration_s)."""
SLOW_DEFAULT_S = 20.0
"""How long a slow rank straggles when the fault names no duration."""


def describe(worker: WorkerInfo) -> str:
    return f"rank {worker.rank} (pid {worker.pid}, node {worker.node_id[:12]} {worker.node_ip})"


def kill_worker(runner: NodeRunner, worker: WorkerInfo) -> str:
    """SIGKILL the rank's process: a lost GPU or a crashed CUDA/NCCL process, as the run sees it."""
    runner.run(procfault.send, worker.pid, signal.SIGKILL)
    return f"sent SIGKILL to {describe(worker)}"


def _stop_with_safety(pid: int, resume_after_s: float) -> int:
    procfault.send(pid, signal.SIGSTOP)
    return procfault.spawn_helper(["resume-after", pid, resume_after_s]).pid


def hang_rank(runner: NodeRunner, worker: WorkerInfo, resume_after_s: float) -> str:
    """SIGSTOP the rank: it stops answering and its peers wait in the next collective."""
    helper = runner.run(_stop_with_safety, worker.pid, resume_after_s)
    return (f"sent SIGSTOP to {describe(worker)}; it hangs until killed "
            f"(helper pid {helper} resumes it after {resume_after_s:.0f} s if nobody does)")


def _start_duty_cycle(pid: int, factor: float, period_s: float, duration_s: float) -> tuple[int, bool]:
    helper = procfault.spawn_helper(["duty-cycle", pid, factor, period_s, duration_s]).pid
    return helper, procfault.can_restore_priority()


def slow_rank(runner: NodeRunner, worker: WorkerInfo, factor: float, period_s: float, duration_s: float) -> str:
    """Stop and continue the rank in a duty cycle at a lower priority: it computes 1/factor of
    the time where a core is free and gets 1/factor of its peers' share where none is, a real
    straggler on an idle machine and on a busy one (runmgr/chaos/procfault.duty_cycle)."""
    helper, restorable = runner.run(_start_duty_cycle, worker.pid, factor, period_s, duration_s)
    nice = procfault.nice_steps(factor)
    after = "then back" if restorable else "kept until the rank ends: lowering a nice value needs root"
    return (f"{describe(worker)} runs {100 / factor:.0f}% of each {period_s:g} s for {duration_s:g} s "
            f"(SIGSTOP/SIGCONT duty cycle, helper pid {helper}) at nice +{nice} ({after}): a {factor:g}x straggler")


def node_raylet_pid(node_id: str) -> int | None:
    """The raylet pid of Ray node ``node_id`` (how the scripted tool recognises the node);
    None without a Ray cluster."""
    import ray

    if not ray.is_initialized():
        return None
    return RayNodeRunner(node_id).run(raylet_pid)


@dataclass(frozen=True)
class BrokenDevice:
    """A node whose scripted npu-smi reports ECC errors, until healed."""

    tools: DeviceTools
    node_id: str

    def undo(self) -> bool:
        self.tools.heal_node(self.node_id)
        return True


def device_ecc(tools: DeviceTools, node_id: str, node_ip: str, raylet: int | None) -> tuple[BrokenDevice, str]:
    """The node's npu-smi starts reporting uncorrectable (double-bit) HBM ECC errors."""
    fault = tools.break_node(node_id, raylet)
    return BrokenDevice(tools, node_id), (
        f"npu-smi on node {node_id[:12]} {node_ip} now reports {fault['double_bit']} uncorrectable "
        f"(double-bit) HBM ECC errors on NPU {fault['npu']} ({tools.directory / 'npu-smi'})")


@dataclass(frozen=True)
class ReadOnlyMount:
    """A checkpoint directory made read-only on one node, to be undone later."""

    runner: NodeRunner
    path: str

    def undo(self) -> bool:
        return bool(self.runner.run(storage.undo_read_only, self.path))


def checkpoint_fail(runner: NodeRunner, path: str) -> tuple[ReadOnlyMount, str]:
    """Every new write under the checkpoint directory fails with EROFS from now on."""
    runner.run(storage.make_read_only, path)
    return ReadOnlyMount(runner, path), (f"{path} is now a read-only mount: the next checkpoint write fails "
                                         f"with [Errno 30] Read-only file system; verified checkpoints stay readable")


Undo = ReadOnlyMount | BrokenDevice
"""A fault that lasts until it is undone (when its sub-run ends, or after duration_s)."""


class FaultEffects:
    """Applies a runtime fault to the workers of the running sub-run."""

    def __init__(self, checkpoint_dir: str, tools: DeviceTools | None,
                 runner_for: Callable[[str, str], NodeRunner] = runner_for) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.tools = tools
        self.runner_for = runner_for

    def apply(self, fault: FaultSpec, workers: Sequence[WorkerInfo]) -> tuple[str, str, Undo | None]:
        """(target, what was done, how to undo it when the fault ends). Raises
        TargetMissing when the fault's rank is not in the sub-run, OSError when the
        node refused or cannot be reached (ProcessLookupError: the process is already gone)."""
        if fault.kind == DEVICE_ECC and fault.node is not None:
            return self._device_ecc(fault.node, "")
        worker = next((w for w in workers if w.rank == fault.rank), None)
        if worker is None:
            raise TargetMissing(f"rank {fault.rank} is not among the {len(workers)} workers of this sub-run")
        runner = self.runner_for(worker.node_id, worker.node_ip)
        if fault.kind == KILL_WORKER:
            return describe(worker), kill_worker(runner, worker), None
        if fault.kind == HANG_RANK:
            return describe(worker), hang_rank(runner, worker, fault.duration_s or HANG_SAFETY_S), None
        if fault.kind == SLOW_RANK:
            detail = slow_rank(runner, worker, fault.factor, fault.period_s, fault.duration_s or SLOW_DEFAULT_S)
            return describe(worker), detail, None
        if fault.kind == DEVICE_ECC:
            return self._device_ecc(worker.node_id, worker.node_ip)
        if fault.kind == CHECKPOINT_FAIL:
            mount, detail = checkpoint_fail(runner, self.checkpoint_dir)
            return f"checkpoint directory on node {worker.node_id[:12]} {worker.node_ip}", detail, mount
        raise ValueError(f"{fault.kind} is not a runtime fault")

    def _device_ecc(self, node_id: str, node_ip: str) -> tuple[str, str, BrokenDevice]:
        if self.tools is None:
            raise TargetMissing("the schedule has no device fault, so no chaos tools directory exists")
        broken, detail = device_ecc(self.tools, node_id, node_ip, node_raylet_pid(node_id))
        return f"node {node_id[:12]} {node_ip}".strip(), detail, broken


class TargetMissing(LookupError):
    """The fault's target does not exist in this sub-run."""
