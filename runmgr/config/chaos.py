"""The chaos schedule: which faults to inject into a run, when, and where.

``conf/chaos/*.yaml`` fills :class:`ChaosConfig` (the ``chaos`` section of
the run config); ``chaos=none`` is an empty schedule. Each :class:`FaultSpec`
is flat so that a YAML line reads like the fault it describes, e.g.
``{kind: kill_worker, at_step: 30, rank: 1}``. Unknown keys, wrong types and
unknown kinds fail when the YAML is merged; :meth:`ChaosConfig.problems`
catches the rest (a trigger that can never fire, a field the kind cannot
honour) as one-line messages. :mod:`runmgr.chaos` carries the schedule out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Optional


class FaultKind(str, Enum):
    """What a fault does. A ``str`` enum: OmegaConf types enums (not ``Literal``) and
    converts by member name, so each name is its value; a member equals its string."""

    kill_worker = "kill_worker"
    hang_rank = "hang_rank"
    slow_rank = "slow_rank"
    device_ecc = "device_ecc"
    checkpoint_fail = "checkpoint_fail"
    pause_at_step = "pause_at_step"
    pause_in_checkpoint = "pause_in_checkpoint"
    garbage_data = "garbage_data"
    recurring_instability = "recurring_instability"
    lr_blowup = "lr_blowup"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


KILL_WORKER = FaultKind.kill_worker
HANG_RANK = FaultKind.hang_rank
SLOW_RANK = FaultKind.slow_rank
DEVICE_ECC = FaultKind.device_ecc
CHECKPOINT_FAIL = FaultKind.checkpoint_fail
PAUSE_AT_STEP = FaultKind.pause_at_step
PAUSE_IN_CHECKPOINT = FaultKind.pause_in_checkpoint
GARBAGE_DATA = FaultKind.garbage_data
RECURRING_INSTABILITY = FaultKind.recurring_instability
LR_BLOWUP = FaultKind.lr_blowup

RUNTIME_KINDS = (KILL_WORKER, HANG_RANK, SLOW_RANK, DEVICE_ECC, CHECKPOINT_FAIL)
"""Faults the driver acts out on the live processes of a sub-run when it sees their step."""
RANK_KINDS = (PAUSE_AT_STEP, PAUSE_IN_CHECKPOINT)
"""Faults the ranks act out themselves, exactly at their step (the driver hands them over)."""
DATA_KINDS = (GARBAGE_DATA, RECURRING_INSTABILITY)
INPUT_KINDS = (GARBAGE_DATA, RECURRING_INSTABILITY, LR_BLOWUP)
"""Faults written into the run's inputs (data, config) before launch."""
FAULT_KINDS = tuple(FaultKind)

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
"""The fault classes of OPT-175B's Run 12 (seed 002) and the chaos kind that
reproduces each on a laptop; conf/chaos/opt_run12.yaml holds them all."""

FIELDS_OF_KIND: dict[FaultKind, frozenset[str]] = {
    KILL_WORKER: frozenset({"rank"}),
    HANG_RANK: frozenset({"rank", "duration_s"}),
    SLOW_RANK: frozenset({"rank", "duration_s", "factor", "period_s"}),
    DEVICE_ECC: frozenset({"rank", "node", "duration_s"}),
    CHECKPOINT_FAIL: frozenset({"rank", "duration_s"}),
    PAUSE_AT_STEP: frozenset({"duration_s"}),
    PAUSE_IN_CHECKPOINT: frozenset({"duration_s"}),
    GARBAGE_DATA: frozenset({"steps"}),
    RECURRING_INSTABILITY: frozenset({"steps", "repeats", "every_steps"}),
    LR_BLOWUP: frozenset({"factor"}),
}
"""The optional fields each kind honours besides ``kind`` and ``at_step`` (runtime
and rank kinds also ``at_subrun``, runtime kinds ``after_seconds``); any other field
set away from its default is refused rather than ignored."""


@dataclass
class FaultSpec:
    """One fault of the schedule (see FIELDS_OF_KIND for the fields each kind uses)."""

    kind: FaultKind
    """What the fault does: kill_worker, hang_rank, slow_rank, device_ecc, checkpoint_fail,
    pause_at_step, pause_in_checkpoint, garbage_data, recurring_instability or lr_blowup."""
    at_step: int = 1
    """Runtime faults: fire at the first step >= at_step the driver sees. pause_at_step: every
    rank finishes step at_step and waits before the next. pause_in_checkpoint: rank 0 holds
    inside the write of the checkpoint of step at_step, its files written and its manifest (the
    commit) not yet (asynchronous saves; the other ranks wait for it in the next step's
    collective). Data faults: the first step of the
    garbage window, counted as in an uninterrupted run (window = stream positions
    [(at_step-1) x global batch, ...)); skip ranges before it make the run reach it earlier.
    lr_blowup: the step at which the mistaken LR peaks."""
    at_subrun: Optional[int] = None
    """Runtime faults and pauses: act only in sub-run <run>.NN with NN >= at_subrun (None: any).
    For runtime faults NN counts the schedule's own sub-runs: a sub-run that ended with no fault
    of the schedule in it (a person's own kill) moves them one later, and the console and the
    logbook say so. Pauses, which the ranks carry out, keep the sub-run's number as written."""
    after_seconds: Optional[float] = None
    """Runtime faults: also wait until the sub-run's workers have been up this long."""
    rank: int = 0
    """Target rank: its process (kill, hang, slow) or its node (device_ecc, checkpoint_fail)."""
    node: Optional[str] = None
    """device_ecc: the Ray node id to break, instead of the node of ``rank``."""
    duration_s: Optional[float] = None
    """slow_rank: how long the straggling lasts (default 20 s). hang_rank: a safety net that
    resumes the process after this long if nobody killed it (default 600 s), so a lost
    driver never leaves a stopped orphan. Pauses: the longest the ranks wait for their
    release (default 600 s). device_ecc / checkpoint_fail: how long the fault lasts (None:
    device_ecc for the rest of the run, checkpoint_fail until the sub-run ends)."""
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

    def __post_init__(self) -> None:
        self.kind = FaultKind(self.kind)  # a plain string from Python code; a bad one raises ValueError

    @property
    def is_runtime(self) -> bool:
        return self.kind in RUNTIME_KINDS

    def label(self, index: int) -> str:
        """Stable identity within a schedule, used to remember that a fault fired."""
        return f"{index}:{self.kind}@{self.at_step}"

    def problems(self, where: str) -> list[str]:
        """One-line messages for values that cannot work, prefixed by ``where``."""
        out = self._unused_fields(where)
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

    def _unused_fields(self, where: str) -> list[str]:
        """A field set for a kind that does not use it: refused, not silently ignored."""
        honoured = FIELDS_OF_KIND[self.kind] | {"kind", "at_step"}
        if self.kind in RUNTIME_KINDS or self.kind in RANK_KINDS:
            honoured |= {"at_subrun"}
        if self.kind in RUNTIME_KINDS:
            honoured |= {"after_seconds"}
        defaults = FaultSpec(kind=self.kind)
        ignored = [f.name for f in fields(self)
                   if f.name not in honoured and getattr(self, f.name) != getattr(defaults, f.name)]
        if not ignored:
            return []
        return [f"{where}: {self.kind} does not use {', '.join(ignored)}; remove it (it uses "
                f"{', '.join(sorted(honoured - {'kind'}))})"]

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
        if self.seed < 0:
            out.append(f"chaos.seed must be >= 0 (numpy seeds the garbage bytes with it), got {self.seed}")
        lr_faults = [f for f in self.faults if f.kind == LR_BLOWUP]
        if len(lr_faults) > 1:
            out.append("chaos.faults: at most one lr_blowup (it rewrites the LR schedule of the whole run)")
        return out

    def of_kinds(self, kinds: tuple[FaultKind, ...]) -> list[tuple[int, FaultSpec]]:
        """(index, fault) of the faults whose kind is in ``kinds``."""
        return [(i, f) for i, f in enumerate(self.faults) if f.kind in kinds]
