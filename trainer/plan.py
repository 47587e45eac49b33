"""The resume plan: plain data that tells the trainer how to (re)start.

runmgr's remedies produce plans; the trainer reads one at start. A plan is
loggable, replayable and testable without Ray, and another trainer could be
driven by the same plan through an adapter.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from trainer.parallel.layout import Layout


@dataclass(frozen=True)
class SkipRange:
    """Samples ``[start, end)`` of the data stream never trained on.

    Indices are positions in the sampler's stream (Megatron's "consumed
    samples"), so they are independent of batch size and world size, and the
    sampler maps each to a dataset sample that the logbook can decode.
    """

    start: int
    end: int


@dataclass(frozen=True)
class ResumePlan:
    """How a sub-run starts. The default is a fresh run from step 0."""

    subrun: str = "0.00"
    """Sub-run id (``12.03``), reported back with every step."""
    start_checkpoint: Optional[str] = None
    """Directory of the verified checkpoint to load; None starts from init."""
    skip_ranges: tuple[SkipRange, ...] = ()
    """Sample ranges to skip, cumulative over the lineage."""
    lr_scale: float = 1.0
    """Multiplies the scheduled learning rate for the rest of the run."""
    rewarmup_iters: int = 0
    """Linear re-warmup from 0 to the scheduled LR over this many steps after the start."""
    clip_grad: Optional[float] = None
    """Overrides optim.clip_grad when set."""
    reset_optimizer: bool = False
    """Keep the weights but start Adam's moments (and step count) afresh."""
    data_parallel_size: Optional[int] = None
    """Data-parallel replicas of this sub-run (each ``tensor x pipeline`` ranks); None
    means the configured world's. A smaller one (after a node is excluded without a
    spare) keeps the global batch by gradient accumulation; the trainer refuses to run
    when the ranks started hold another data-parallel size."""
    skip_iterations: tuple[int, ...] = ()
    """Iterations (1-indexed, Megatron's ``--iterations-to-skip``) run as dummy
    steps: each consumes its global batch and advances the step, counted as
    skipped samples, with no update and no step report. Unlike ``skip_ranges``
    (stream positions jumped over), the step count and the stream stay aligned."""
    restart_schedule: bool = False
    """The LR schedule restarts at the start step (Megatron's ``--no-load-optim``
    skips the scheduler state): step s gets the schedule's LR of s - start, a fresh
    warmup then the decay from the peak. Checkpoints record the restart point, so
    later resumes continue the restarted schedule."""
    local_norms_steps: tuple[int, ...] = ()
    """Steps whose per-weight gradient norms the trainer reports besides every
    ``training.local_norms_interval``-th (the re-run after a rollback, so that a
    returning instability shows where it enters); cumulative over the lineage."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes no rank of this sub-run may be placed on (cumulative over the lineage:
    excluded for hardware faults or repeated straggling). Read by the executor, not
    by the trainer."""

    def problems(self, layout: "Layout") -> list[str]:
        """What keeps this rank from carrying the plan out in ``layout`` (the config's
        split of the ranks started: :meth:`trainer.config.TrainerConfig.layout`)."""
        if self.data_parallel_size is not None and self.data_parallel_size != layout.dp:
            return [f"the plan of sub-run {self.subrun} asks for data parallel {self.data_parallel_size}, "
                    f"but the {layout.world_size} ranks started hold data parallel {layout.dp} "
                    f"({layout.describe()})"]
        return []

    def to_dict(self) -> dict:
        out = asdict(self)
        out["skip_ranges"] = [[r.start, r.end] for r in self.skip_ranges]
        out["avoid_nodes"] = list(self.avoid_nodes)
        out["skip_iterations"] = list(self.skip_iterations)
        out["local_norms_steps"] = list(self.local_norms_steps)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ResumePlan":
        values = dict(data)
        values["skip_ranges"] = tuple(SkipRange(int(a), int(b)) for a, b in values.get("skip_ranges", ()))
        values["avoid_nodes"] = tuple(str(node) for node in values.get("avoid_nodes", ()))
        values["skip_iterations"] = tuple(int(i) for i in values.get("skip_iterations", ()))
        values["local_norms_steps"] = tuple(int(i) for i in values.get("local_norms_steps", ()))
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ResumePlan":
        return cls.from_dict(json.loads(text))
