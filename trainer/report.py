"""What the trainer tells whoever runs it: one report per step, one per
checkpoint, and heartbeats per phase. The trainer calls a :class:`Reporter`;
standalone it prints, under runmgr it is streamed to the driver."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional, Protocol

PAUSED = "paused"
"""A rank held between two steps by whoever runs the trainer (runmgr's chaos
pause_at_step); the trainer itself never sends it."""
PHASES = ("init", "step", "checkpoint", "snapshot", "eval", PAUSED)


@dataclass(frozen=True)
class StepReport:
    """One optimizer step, reported by rank 0 after the step completed."""

    subrun: str
    step: int
    """Steps completed (1 after the first optimizer step)."""
    loss: float
    """Mean language-model loss over the global batch."""
    grad_norm: float
    """Global gradient norm before clipping (unscaled); inf/nan on overflow."""
    lr: float
    """Learning rate used for this step."""
    loss_scale: float
    """fp16 loss scale in force (1.0 when not fp16)."""
    tokens: int
    """Tokens trained on in this step (global)."""
    consumed_samples: int
    """Stream position after this step (skip ranges included)."""
    step_time: float
    """Wall seconds of the step on rank 0."""
    compute_times: tuple[float, ...]
    """Per-rank seconds of forward+backward in this step, index = rank."""
    skipped: bool
    """True when fp16 overflow skipped the update."""
    time: float
    """Unix time at the end of the step."""
    skipped_samples: int = 0
    """Samples consumed by dummy iterations (``ResumePlan.skip_iterations``) so
    far, over the lineage (Megatron's ``skipped samples``)."""
    tokens_per_s: Optional[float] = None
    """Global tokens trained per wall second of this step (None: not measured)."""
    mfu: Optional[float] = None
    """Model FLOPs utilisation: ``tokens_per_s x FLOPs per token`` (trainer/flops.py) over the
    devices' dense peak; None when the peak is unknown (CPU, a device not in the table)."""
    peak_memory_bytes: tuple[int, ...] = ()
    """Per rank (index = rank), the most memory it held so far, read once the step's gradients
    are computed (the step's own update counts in the next step's figure): the device
    allocator's peak, or the process's peak RSS on CPU; empty when not measured."""
    optimizer_state_bytes: tuple[int, ...] = ()
    """Per-rank bytes of the optimizer state (index = rank), measured after
    the sub-run's first update: about 1/DP of the replicated size under
    ZeRO-1 or FSDP2 (:func:`trainer.parallel.footprint.optimizer_state_bytes`)."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["compute_times"] = list(self.compute_times)
        out["peak_memory_bytes"] = list(self.peak_memory_bytes)
        out["optimizer_state_bytes"] = list(self.optimizer_state_bytes)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "StepReport":
        """The report of :meth:`to_dict`; keys of a later version are dropped and the
        fields an older one lacks take their defaults."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["compute_times"] = tuple(values.get("compute_times", ()))
        values["peak_memory_bytes"] = tuple(int(b) for b in values.get("peak_memory_bytes", ()))
        values["optimizer_state_bytes"] = tuple(int(b) for b in values.get("optimizer_state_bytes", ()))
        return cls(**values)


@dataclass(frozen=True)
class CheckpointReport:
    """A checkpoint whose manifest is written (it verifies)."""

    subrun: str
    step: int
    path: str
    seconds: float
    """From the save request to the manifest on disk."""
    time: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LocalNormsReport:
    """Every weight's gradient norm at one step (seed 004's "local norms"), reported by
    rank 0 before the step's report: averaged over data parallel, unscaled, before clipping."""

    subrun: str
    step: int
    """The step whose gradients these are (its update follows)."""
    norms: dict[str, float]
    """L2 norm of each parameter's gradient, by parameter name, in model order."""
    time: float

    def to_dict(self) -> dict:
        return {"subrun": self.subrun, "step": self.step, "norms": dict(self.norms), "time": self.time}


@dataclass(frozen=True)
class StartReport:
    """What a sub-run really starts with, reported by rank 0 once the
    checkpoint is loaded and the plan applied (OPT 12.35's lesson: record the
    effective optimizer settings of every restart, not the intended ones)."""

    subrun: str
    start_step: int
    """Steps already done (the loaded checkpoint's step; 0 from init)."""
    resumed_from: str | None
    """Checkpoint directory loaded, None from initialisation."""
    consumed_samples: int
    """Stream position the sub-run starts at."""
    optimizer: tuple[dict, ...]
    """Per param group: name, lr, betas, eps, weight_decay, num_params, step
    (Adam step count, 0 when fresh) and moment_norm (0 when fresh)."""
    loss_scale: float
    lr_scale: float
    clip_grad: float
    """Clipping threshold in force (the plan's override or the config's)."""
    reset_optimizer: bool
    skip_ranges: tuple[tuple[int, int], ...]
    time: float
    layout: str = ""
    """How the ranks split the work (``dp 2 x tp 1 x pp 1``, ``, zero1`` when sharded);
    empty from a trainer that does not say."""
    data_parallel_size: int = 0
    """Data-parallel replicas (0: not said)."""
    accumulation_steps: int = 0
    """Micro-batches per replica per step: the global batch is kept across resizes (0: not said)."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["optimizer"] = [dict(group) for group in self.optimizer]
        out["skip_ranges"] = [list(r) for r in self.skip_ranges]
        return out


@dataclass(frozen=True)
class Heartbeat:
    """A rank is alive in ``phase`` (one of PHASES) at ``step``."""

    rank: int
    phase: str
    step: int
    time: float


class Reporter(Protocol):
    """Receives the trainer's reports; implementations must be cheap and must
    not raise into the training loop, except from ``heartbeat`` to stop the
    rank on purpose: the trainer beats before every step, before it starts a
    checkpoint and (rank 0) before it commits one, so an exception raised
    there ends ``train`` with it before anything more is trained, written or
    committed (runmgr's worker does this when its driver is gone)."""

    def started(self, report: StartReport) -> None: ...

    def step(self, report: StepReport) -> None: ...

    def checkpoint(self, report: CheckpointReport) -> None: ...

    def local_norms(self, report: LocalNormsReport) -> None: ...

    def heartbeat(self, beat: Heartbeat) -> None: ...
