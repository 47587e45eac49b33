"""Failures drawn at Llama 3's published rates, by class.

Table 5 of "The Llama 3 Herd of Models" (Meta, 2024): 419 unexpected
interruptions in a 54-day snapshot of Llama 3 405B pre-training on 16,384
H100 GPUs (78% confirmed or suspected hardware). Each class here carries its
count and what the failing rank says when it happens: the real runtime's
message, which runmgr's death classifier (runmgr/watch/deaths.py) reads as it
would in a live run, so the real policy decides the remedy (a GPU fault
excludes the node, an NCCL timeout restarts, ...).

Failures form a Poisson process whose rate scales with the number of devices
(each device fails independently at the published per-device rate); a class
is drawn by its count, a device uniformly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

LLAMA3_DAYS = 54.0
LLAMA3_DEVICES = 16_384
LLAMA3_INTERRUPTIONS = 419

Scope = Literal["process", "node"]


@dataclass(frozen=True)
class FailureClass:
    """One row of Table 5 and what it looks like from the failing rank."""

    component: str
    """Table 5's component."""
    count: int
    """Interruptions of this class in the 54 days."""
    text: str
    """What the failing rank reports (a real runtime message)."""
    scope: Scope
    """``process``: the rank's process ends with ``text``; ``node``: its whole node goes away."""


_NODE_DIED = "The actor died because its node has died. Node Id: {node}"
_XID = "NVRM: Xid (PCI:0000:3b:00): {code}, pid=4721, name=python, {what}"

LLAMA3_TABLE5: tuple[FailureClass, ...] = (
    FailureClass("Faulty GPU", 148, _XID.format(code=79, what="GPU has fallen off the bus."), "process"),
    FailureClass("GPU HBM3 Memory", 72, "RuntimeError: CUDA error: uncorrectable ECC error encountered", "process"),
    FailureClass("Software Bug", 54, "RuntimeError: CUDA error: an illegal memory access was encountered", "process"),
    FailureClass("Network Switch/Cable", 35,
                 "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network "
                 "error, NCCL version 2.21.5 ncclRemoteError", "process"),
    FailureClass("Host Maintenance", 32, _NODE_DIED, "node"),
    FailureClass("GPU SRAM Memory", 19, _XID.format(code=48, what="An uncorrectable double bit error (DBE)"),
                 "process"),
    FailureClass("GPU System Processor", 17, _XID.format(code=119, what="Timeout after 6s of waiting for RPC "
                                                                        "response from GPU0 GSP!"), "process"),
    FailureClass("NIC", 7, "NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0, "
                           "vendor err 129 - NCCL error", "process"),
    FailureClass("NCCL Watchdog Timeouts", 7, "[Rank 5] Watchdog caught collective operation timeout: "
                                              "WorkNCCL(SeqNum=812, OpType=ALLREDUCE) ran for 600000 milliseconds",
                 "process"),
    FailureClass("Silent Data Corruption", 6, "the iteration failed result validation (exit code 17)", "process"),
    FailureClass("GPU Thermal Interface + Sensor", 6, _XID.format(code=79, what="GPU has fallen off the bus."),
                 "process"),
    FailureClass("SSD", 3, "OSError: [Errno 5] Input/output error: '/local/ckpt/shard_3.distcp'", "process"),
    FailureClass("Power Supply", 3, _NODE_DIED, "node"),
    FailureClass("Server Chassis", 2, _NODE_DIED, "node"),
    FailureClass("IO Expansion Board", 2, _NODE_DIED, "node"),
    FailureClass("Dependency", 2, "RuntimeError: CUDA error: an illegal memory access was encountered", "process"),
    FailureClass("CPU", 2, _NODE_DIED, "node"),
    FailureClass("System Memory", 2, _NODE_DIED, "node"),
)
assert sum(c.count for c in LLAMA3_TABLE5) == LLAMA3_INTERRUPTIONS


@dataclass(frozen=True)
class Failure:
    """One drawn interruption: when, which device, which class."""

    time: float
    """Seconds from the start of the simulated run."""
    device: int
    cls: FailureClass


def llama3_rate_per_device_s() -> float:
    """Interruptions per device-second in Llama 3's snapshot."""
    return LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 86_400.0 * LLAMA3_DEVICES)


def draw_failures(devices: int, span_s: float, rng: random.Random,
                  classes: tuple[FailureClass, ...] = LLAMA3_TABLE5,
                  rate_per_device_s: float | None = None) -> list[Failure]:
    """Failures over ``span_s`` seconds of ``devices`` devices, oldest first."""
    rate = (llama3_rate_per_device_s() if rate_per_device_s is None else rate_per_device_s) * devices
    weights = [c.count for c in classes]
    failures, now = [], rng.expovariate(rate)
    while now < span_s:
        failures.append(Failure(now, rng.randrange(devices), rng.choices(classes, weights)[0]))
        now += rng.expovariate(rate)
    return failures
