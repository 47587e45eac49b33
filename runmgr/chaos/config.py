"""The chaos schedule: which faults to inject into a run, when, and where.

``conf/chaos/*.yaml`` fills :class:`ChaosConfig` (the ``chaos`` section of
the run config); ``chaos=none`` is an empty schedule. Each :class:`FaultSpec`
is flat so that a YAML line reads like the fault it describes, e.g.
``{kind: kill_worker, at_step: 30, rank: 1}``. Unknown keys and wrong types
fail when the YAML is merged; :meth:`ChaosConfig.problems` catches the rest
(unknown kind, a trigger that can never fire) as one-line messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Faults that act on the live processes of a sub-run when their trigger is reached.
KILL_WORKER = "kill_worker"
HANG_RANK = "hang_rank"
SLOW_RANK = "slow_rank"
DEVICE_ECC = "device_ecc"
CHECKPOINT_FAIL = "checkpoint_fail"
RUNTIME_KINDS = (KILL_WORKER, HANG_RANK, SLOW_RANK, DEVICE_ECC, CHECKPOINT_FAIL)

# Faults written into the run's inputs (data, config) before launch.
GARBAGE_DATA = "garbage_data"
RECURRING_INSTABILITY = "recurring_instability"
LR_BLOWUP = "lr_blowup"
DATA_KINDS = (GARBAGE_DATA, RECURRING_INSTABILITY)
INPUT_KINDS = (GARBAGE_DATA, RECURRING_INSTABILITY, LR_BLOWUP)

FAULT_KINDS = RUNTIME_KINDS + INPUT_KINDS

OPT_RUN12_CLASSES = {
    "lost GPU (12.01, 12.10)": KILL_WORKER,
    "CUDA errors (12.02-12.04, 12.09, 12.15, 12.17)": KILL_WORKER,
    "NCCL error (12.08)": KILL_WORKER,
    "job hangs (12.05, 12.06)": HANG_RANK,
    "job slowdown (12.11)": SLOW_RANK,
    "ECC errors (12.17-12.34)": DEVICE_ECC,
    "blob-storage problems (12.17-12.34)": CHECKPOINT_FAIL,
    # The demo trains in fp32: no loss scale to overflow; garbage's gradient-norm spike stands in.
    "gradient overflow (12.17-12.34)": GARBAGE_DATA,
    "spikes that need a rollback": GARBAGE_DATA,
    "LR cuts (12.42-12.53), then an Adam reset (12.16's backup plan)": RECURRING_INSTABILITY,
}
"""The fault classes of OPT-175B's Run 12 (../shared/DIGEST.md, seed 002) and the
chaos kind that reproduces each on a laptop; conf/chaos/opt_run12.yaml holds them all."""


@dataclass
class FaultSpec:
    """One fault of the schedule. Fields a kind does not use are ignored."""

    kind: str = ""
    """One of FAULT_KINDS: kill_worker, hang_rank, slow_rank, device_ecc, checkpoint_fail,
    garbage_data, recurring_instability, lr_blowup."""
    at_step: int = 1
    """Runtime faults: fire at the first reported step >= at_step. Data faults: the first
    step of the garbage window, counted as in an uninterrupted run (window = stream
    positions [(at_step-1) x global batch, ...)); skip ranges before it make the run
    reach it earlier. lr_blowup: the step at which the mistaken LR peaks."""
    at_subrun: Optional[int] = None
    """Runtime faults: fire only in sub-run <run>.NN with NN >= at_subrun (None: any)."""
    after_seconds: Optional[float] = None
    """Runtime faults: also wait until the sub-run's workers have been up this long."""
    rank: int = 0
    """Target rank: its process (kill, hang, slow) or its node (device_ecc)."""
    node: Optional[str] = None
    """device_ecc: the Ray node id to break, instead of the node of ``rank``."""
    duration_s: Optional[float] = None
    """slow_rank: how long the straggling lasts (default 20 s). hang_rank: a safety net that
    resumes the process after this long if nobody killed it (default 600 s), so a lost
    driver never leaves a stopped orphan. device_ecc / checkpoint_fail: how long the fault
    lasts (None: device_ecc for the rest of the run, checkpoint_fail until the sub-run ends)."""
    factor: float = 3.0
    """slow_rank: the rank runs 1/factor of the time (a factor-x straggler).
    lr_blowup: the mistaken peak LR as a multiple of optim.lr."""
    period_s: float = 0.02
    """slow_rank: length of one stop/continue cycle. Keep it well below the step's
    compute time: a slow device is slow all the time, and a cycle as long as a step
    lets whole steps fit in a run window and others stop outside forward/backward,
    where the straggler detector (which compares compute times) cannot see it."""
    steps: int = 0
    """Data faults: length of each garbage window in steps (global batches)."""
    repeats: int = 2
    """recurring_instability: how many garbage windows."""
    every_steps: int = 0
    """recurring_instability: steps from one window's start to the next one's."""

    @property
    def is_runtime(self) -> bool:
        return self.kind in RUNTIME_KINDS

    def label(self, index: int) -> str:
        """Stable identity within a schedule, used to remember that a fault fired."""
        return f"{index}:{self.kind}@{self.at_step}"

    def problems(self, where: str) -> list[str]:
        """One-line messages for values that cannot work, prefixed by ``where``."""
        if self.kind not in FAULT_KINDS:
            return [f"{where}.kind: unknown fault kind {self.kind!r}; use one of {', '.join(FAULT_KINDS)}"]
        out = []
        if self.at_step < 1:
            out.append(f"{where}.at_step must be >= 1, got {self.at_step}")
        if self.rank < 0:
            out.append(f"{where}.rank must be >= 0, got {self.rank}")
        if self.duration_s is not None and self.duration_s <= 0:
            out.append(f"{where}.duration_s must be > 0 or null, got {self.duration_s}")
        if self.kind == SLOW_RANK and (self.factor <= 1 or self.period_s <= 0):
            out.append(f"{where}: slow_rank needs factor > 1 and period_s > 0, got {self.factor} and {self.period_s}")
        if self.kind == LR_BLOWUP and self.factor <= 1:
            out.append(f"{where}: lr_blowup needs factor > 1 (the mistaken LR over optim.lr), got {self.factor}")
        if self.kind in DATA_KINDS and self.steps < 1:
            out.append(f"{where}: {self.kind} needs steps >= 1 (the garbage window's length), got {self.steps}")
        if self.kind == RECURRING_INSTABILITY and (self.repeats < 2 or self.every_steps <= self.steps):
            out.append(f"{where}: recurring_instability needs repeats >= 2 and every_steps > steps "
                       f"({self.steps}) so the windows do not overlap, got {self.repeats} and {self.every_steps}")
        return out

    def last_step(self) -> int:
        """The last step the fault concerns (its trigger, or the end of its last window)."""
        if self.kind == GARBAGE_DATA:
            return self.at_step + self.steps - 1
        if self.kind == RECURRING_INSTABILITY:
            return self.at_step + (self.repeats - 1) * self.every_steps + self.steps - 1
        return self.at_step


@dataclass
class ChaosConfig:
    """Faults injected into the run's real processes and inputs (empty: no chaos)."""

    faults: list[FaultSpec] = field(default_factory=list)
    """The schedule; each fault fires at most once per lineage (remembered in chaos_state.json)."""
    seed: int = 0
    """Seed of the garbage bytes written into data windows."""

    @property
    def enabled(self) -> bool:
        return bool(self.faults)

    def problems(self, train_iters: Optional[int] = None) -> list[str]:
        """Every problem as a one-line message naming the fault (empty when valid).
        With ``train_iters``, a fault the run can never reach is a problem too."""
        out = []
        for index, fault in enumerate(self.faults):
            where = f"chaos.faults[{index}]"
            found = fault.problems(where)
            if not found and train_iters is not None and fault.last_step() > train_iters:
                found = [f"{where} ({fault.kind}) reaches step {fault.last_step()} but training.train_iters is "
                         f"{train_iters}: it would never fire; move it earlier"]
            out += found
        lr_faults = [f for f in self.faults if f.kind == LR_BLOWUP]
        if len(lr_faults) > 1:
            out.append("chaos.faults: at most one lr_blowup (it rewrites the LR schedule of the whole run)")
        return out

    def of_kinds(self, kinds: tuple[str, ...]) -> list[tuple[int, FaultSpec]]:
        """(index, fault) of the faults whose kind is in ``kinds``."""
        return [(i, f) for i, f in enumerate(self.faults) if f.kind in kinds]
