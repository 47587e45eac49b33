"""What the detectors look at: typed, timestamped observations.

Each observation carries its own time, so detectors never read a clock. They
are built from the trainer's reports (:class:`trainer.report.StepReport`,
:class:`trainer.report.Heartbeat`), from a parsed log line, from a health poll
or from a worker's exit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from trainer.report import Heartbeat, LocalNormsReport, StepReport

DEVICE_READINGS = ("health", "ecc", "event")


@dataclass(frozen=True)
class LocalNormsObservation:
    """Every weight's gradient norm at one step (seed 004's local norms), before clipping."""

    step: int
    time: float
    subrun: str
    norms: Mapping[str, float]
    """L2 norm of each weight's gradient, by parameter name."""

    @classmethod
    def from_report(cls, report: LocalNormsReport) -> "LocalNormsObservation":
        return cls(report.step, report.time, report.subrun, dict(report.norms))


@dataclass(frozen=True)
class StepObservation:
    """One logged training step (or one log line covering ``iterations`` steps)."""

    step: int
    """Optimizer steps completed (Megatron's ``iteration``)."""
    time: float
    """Seconds (Unix time, or seconds since the log's start) at the end of the step."""
    subrun: str = ""
    """Sub-run id (``12.03``); a new id tells detectors the run restarted."""
    loss: Optional[float] = None
    """Mean LM loss; None when the line did not report one (all steps skipped)."""
    grad_norm: Optional[float] = None
    """Global gradient norm before clipping; None when not reported."""
    lr: Optional[float] = None
    """Learning rate of the step."""
    loss_scale: Optional[float] = None
    """fp16 loss scale in force (1.0 in bf16/fp32 runs)."""
    consumed_samples: Optional[int] = None
    """Stream position after the step (Megatron's ``consumed samples``)."""
    global_batch: Optional[int] = None
    """Samples per step, when the source says so."""
    step_time: Optional[float] = None
    """Wall seconds per step (Megatron: the interval's mean)."""
    tokens_per_s: Optional[float] = None
    """Throughput as the source reports it (global or per device; only ratios matter)."""
    compute_times: tuple[float, ...] = ()
    """Per-rank forward+backward seconds, index = rank; empty when unknown."""
    iterations: int = 1
    """Steps this observation covers (a Megatron line covers ``log_interval``)."""
    skipped_iterations: int = 0
    """Of those, steps whose update fp16 overflow skipped."""
    nan_iterations: int = 0
    """Of those, steps whose loss was NaN/Inf (Megatron counts them)."""

    @classmethod
    def from_report(cls, report: StepReport) -> "StepObservation":
        """The observation of one trainer step."""
        tokens_per_s = report.tokens / report.step_time if report.step_time > 0 else None
        return cls(
            step=report.step,
            time=report.time,
            subrun=report.subrun,
            loss=report.loss,
            grad_norm=report.grad_norm,
            lr=report.lr,
            loss_scale=report.loss_scale,
            consumed_samples=report.consumed_samples,
            step_time=report.step_time,
            tokens_per_s=tokens_per_s,
            compute_times=tuple(report.compute_times),
            skipped_iterations=int(report.skipped),
        )

    @property
    def skipped(self) -> bool:
        """True when every step of the observation was an overflow skip."""
        return self.iterations > 0 and self.skipped_iterations >= self.iterations

    @property
    def speed(self) -> Optional[float]:
        """Throughput in the best unit the source gives; comparable within one source."""
        if self.tokens_per_s is not None and self.tokens_per_s > 0:
            return self.tokens_per_s
        if self.step_time is not None and self.step_time > 0:
            return (self.global_batch or 1) / self.step_time
        return None


def onset_position(
    previous: Optional[StepObservation], obs: StepObservation
) -> tuple[int, Optional[int], Optional[int]]:
    """Where trouble seen in ``obs`` may have started.

    Returns the first step ``obs`` covers, the stream position (consumed
    samples) where that step's batch starts, and the samples per step; the
    last two are None when the source gives no sample positions.
    """
    covered = max(obs.iterations, 1)
    onset_step = obs.step - covered + 1
    per_step = obs.global_batch
    if previous is not None and previous.consumed_samples is not None and obs.consumed_samples is not None:
        if per_step is None and obs.step > previous.step:
            per_step = (obs.consumed_samples - previous.consumed_samples) // (obs.step - previous.step)
        if previous.step == onset_step - 1:
            return onset_step, previous.consumed_samples, per_step
    if obs.consumed_samples is not None and per_step:
        return onset_step, obs.consumed_samples - per_step * covered, per_step
    return onset_step, None, per_step


@dataclass(frozen=True)
class HeartbeatObservation:
    """A rank said it is alive in ``phase`` at ``step``."""

    rank: int
    phase: str
    """One of trainer.report.PHASES: init, step, checkpoint, eval."""
    step: int
    time: float
    node: str = ""
    """Node the rank runs on (the controller knows the placement)."""
    subrun: str = ""
    for_node: bool = False
    """The beat stands for every rank of ``node``: a node agent's summary, the last beat of the
    node's laggard (the running rank that beat least recently). The hang detector then watches
    the node, not the rank (runmgr/agents/summary.py)."""

    @classmethod
    def from_heartbeat(cls, beat: Heartbeat, node: str = "", subrun: str = "",
                       for_node: bool = False) -> "HeartbeatObservation":
        """The observation of a trainer heartbeat, placed on ``node``."""
        return cls(rank=beat.rank, phase=beat.phase, step=beat.step, time=beat.time, node=node, subrun=subrun,
                   for_node=for_node)

    @property
    def watched_as(self) -> int | str:
        """What the hang detector keeps this beat under: its rank, or its node when it stands for it."""
        return self.node if self.for_node else self.rank


@dataclass(frozen=True)
class DeviceObservation:
    """One reading of one accelerator from the health poll.

    ``kind`` says which fields are meaningful: ``health`` (``status``),
    ``ecc`` (``correctable`` / ``uncorrectable``, volatile counts since the
    last driver reset) or ``event`` (``code`` and ``message``, an Xid or a
    runtime error code).
    """

    node: str
    device: int
    kind: str
    time: float
    status: str = "OK"
    """Health as the tool prints it: OK, Warning, Alarm, Critical, UNKNOWN."""
    correctable: Optional[int] = None
    uncorrectable: Optional[int] = None
    code: Optional[int] = None
    """Xid number or runtime error code of an ``event``."""
    message: str = ""


@dataclass(frozen=True)
class CheckpointObservation:
    """A checkpoint that verified (its manifest is written), at ``step``."""

    step: int
    time: float
    consumed_samples: Optional[int] = None
    """Stream position after ``step``, when known."""
    subrun: str = ""


@dataclass(frozen=True)
class WorkerExit:
    """A worker process ended; ``text`` is its error output (the tail of stderr)."""

    rank: int
    node: str
    text: str
    time: float
    exit_code: Optional[int] = None
    """Process exit status; negative for a signal (-9 is SIGKILL)."""
    subrun: str = ""
    output: tuple[str, ...] = ()
    """The last lines the worker printed (stdout and stderr), oldest first; empty when
    its output is not at hand (a rank of the built-in trainer: ``text`` is its traceback)."""


@dataclass(frozen=True)
class JobEnded:
    """Every rank of a sub-run ended with exit code 0."""

    subrun: str
    time: float
    last_step: int
    """The furthest step the sub-run reached (its iteration lines and its saves)."""
    final_step: int
    """The step the run trains to (``training.train_iters``, a Megatron job's ``--train-iters``)."""
    start_step: int = 0
    """The step the sub-run started from."""
    newest_checkpoint: Optional[int] = None
    """The newest verified checkpoint's step when it ended (None: none yet)."""
    steps_reported: int = 0
    """Steps the sub-run reported (a Megatron job: its iteration lines)."""
    output: tuple[str, ...] = ()
    """The last lines its ranks printed, oldest first."""


@dataclass(frozen=True)
class LaunchFailure:
    """The workers of a sub-run could not be placed or started (the executor's error)."""

    subrun: str
    text: str
    time: float
    warm: bool = False
    """A warm restart that failed (its spares or a peer's memory): a cold restart follows."""


@dataclass(frozen=True)
class UploadObservation:
    """One attempt of the driver's S3 mirror: a checkpoint's copy uploaded and
    verified (``ok``), or an attempt that failed (``error``: one line, no credentials)."""

    step: int
    """Step of the checkpoint the attempt was for."""
    time: float
    ok: bool
    error: str = ""
    pending_steps: tuple[int, ...] = ()
    """Checkpoints still waiting for their copy after this attempt (kept on the local disk)."""


@dataclass(frozen=True)
class RankTimings:
    """Per-rank iteration times of one report, for the ranks the source names (Megatron's
    straggler line gives only the fastest and the slowest rank)."""

    step: int
    """The last step logged before the report."""
    time: float
    subrun: str = ""
    seconds: Mapping[int, float] = field(default_factory=dict)
    """Mean seconds per iteration, by global rank."""


@dataclass(frozen=True)
class SaveStarted:
    """The trainer began writing the checkpoint of ``step`` (Megatron's ``saving checkpoint at iteration``)."""

    step: int
    time: float
    subrun: str = ""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """The trainer resumed from the checkpoint of ``step`` at ``path``."""

    step: int
    path: str
    time: float
    subrun: str = ""


@dataclass(frozen=True)
class RefusedValue:
    """A number the job printed that cannot be what it claims (an iteration past 2^63 or past
    its own total, a negative loss, a loss scale of 0, a time of 1e308 ms, text where a number
    belongs): the reader left it out (the field, or the whole line when it is the iteration) and
    says so here, for the logbook. It feeds no detector."""

    subrun: str
    time: float
    field: str
    """The field as the job wrote it (``consumed samples``), or ``iteration``, ``saved iteration``, ..."""
    raw: str
    """Its text, cut to a hundred characters, control characters written as ``\\xNN``."""
    reason: str
    """Why it was refused, in a few words (``below 0``, ``past 2^63 - 1``, ``not a number``)."""
    line: str = ""
    """The line it came from, cut to three hundred characters, written as ``raw`` is."""

