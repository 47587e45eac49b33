"""What the ETTR simulator assumes, each figure with where it comes from.

Figures measured on this project's machine (ENVIRONMENT.md, bench/) are
scaled to a 16,384-device job by one stated factor: nothing at that scale was
measured here. Every figure is a flag of ``runmgr simulate ettr``; the
simulator sweeps the two that decide the answer (checkpoint interval and
restart cost).
"""

from __future__ import annotations

from dataclasses import dataclass

MEASURED_COLD_RESTART_S = 4.0
"""Kill -9 of a rank to the first step of the next sub-run, 2 CPU ranks on gloo, a
process per rank started afresh and the model reloaded from disk: 3.6-4.5 s here
(bench/restart_latency.py; the issue's figure)."""
WARM_RESTART_TARGET_S = 1.0
"""The warm path's target here (survivors stay, a ready spare restores from a peer's
memory): re-forming a gloo group with a replacement took 2.1 s here (ENVIRONMENT.md)
with process start included, so a ready spare should come in under it."""
SCALE_AT_16K = 30.0
"""How much slower every part of a restart (placing 2,048 nodes' processes, forming
NCCL communicators over 16,384 ranks, loading ~400 MB of state per device) is
assumed to be at 16,384 devices than for 2 ranks here: a stated guess, swept."""


@dataclass(frozen=True)
class EttrAssumptions:
    """One simulated lineage: its size, its failure rate and what each event costs."""

    devices: int = 16_384
    """Ranks of the job (one per device)."""
    devices_per_node: int = 8
    """Ranks per node: a node that goes away takes this many."""
    days: float = 54.0
    """Failure-free length of the job (the steps it must train = days x 86,400 / step_time_s)."""
    step_time_s: float = 6.0
    """Seconds per optimizer step. Llama 3 405B: 6 x 405e9 parameters x 16.8M tokens per step
    / (16,384 GPUs x 989 TFLOP/s x 41% MFU) = 6.1 s."""
    failure_scale: float = 1.0
    """Multiplies Llama 3's per-device interruption rate (419 in 54 days on 16,384 GPUs)."""
    checkpoint_interval_steps: int = 25
    """Steps between disk checkpoints (the durable tier)."""
    checkpoint_stall_s: float = 1.0
    """Seconds a disk checkpoint stops training: an asynchronous save's copy of each
    device's ~400 MB of state to host memory, plus the commit (a stated guess, swept)."""
    detect_s: float = 1.0
    """Seconds from a rank's failure to the driver's decision: Ray reports a dead actor
    within ~1 s here (a peer sees a gloo socket close within 0.05 s)."""
    cold_restart_s: float = MEASURED_COLD_RESTART_S * SCALE_AT_16K
    """A cold restart: every rank a new process, the state loaded from disk."""
    warm_restart_s: float = WARM_RESTART_TARGET_S * SCALE_AT_16K
    """A warm restart: the survivors re-form the group with ready spares restored from peers."""
    warm_spares: int = 16
    """Ready spare processes (two nodes' worth): a warm restart needs one per lost rank."""
    snapshot_interval_steps: int = 1
    """Steps between in-memory snapshots (``checkpoint.memory_interval``): a warm restart
    resumes from the newest one."""
    snapshot_s: float = 0.024
    """Seconds one in-memory snapshot stops training: each device's ~396 MB of state
    (405e9 parameters x 16 bytes / 16,384) copied to host memory at 25 GB/s (0.016 s) and
    on to the peer node at 50 GB/s (0.008 s), not overlapped with compute (a stated estimate;
    the overhead measured here, on a tiny CPU model, is in bench/)."""
    spare_refill_s: float = MEASURED_COLD_RESTART_S * SCALE_AT_16K
    """Seconds until a used spare is replaced by a new ready one (a cold start of one process)."""

    def problems(self) -> list[str]:
        """What is inconsistent, in words (empty when the assumptions can run)."""
        positive = {"devices": self.devices, "devices_per_node": self.devices_per_node, "days": self.days,
                    "step_time_s": self.step_time_s, "checkpoint_interval_steps": self.checkpoint_interval_steps,
                    "snapshot_interval_steps": self.snapshot_interval_steps}
        bad = [name for name, value in positive.items() if not value > 0]
        if bad:
            return [f"{bad[0]} must be > 0"]
        costs = {"failure_scale": self.failure_scale, "checkpoint_stall_s": self.checkpoint_stall_s,
                 "detect_s": self.detect_s, "cold_restart_s": self.cold_restart_s,
                 "warm_restart_s": self.warm_restart_s, "snapshot_s": self.snapshot_s,
                 "warm_spares": self.warm_spares,
                 "spare_refill_s": self.spare_refill_s}
        bad = [name for name, value in costs.items() if not value >= 0]
        if bad:
            return [f"{bad[0]} must be >= 0"]
        if self.devices % self.devices_per_node:
            return [f"devices ({self.devices}) must be a multiple of devices_per_node ({self.devices_per_node})"]
        return []

    @property
    def warm_step_time_s(self) -> float:
        """A step's wall time on the warm path: its share of a snapshot added."""
        return self.step_time_s + self.snapshot_s / self.snapshot_interval_steps

    @property
    def train_steps(self) -> int:
        return max(1, round(self.days * 86_400.0 / self.step_time_s))
