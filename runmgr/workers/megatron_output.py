"""What a Megatron-style sub-run's output means to the controller: the lines
its nodes printed become step and checkpoint reports, the watcher's
observations and heartbeats; a node's torchrun that failed becomes one
:class:`WorkerFailure` naming the rank to blame.

Plain data in, plain data out (no Ray): :class:`MegatronWorkerGroup` feeds it.
The log is read by the one Megatron parser (runmgr/watch/megatron_log.py);
torchrun's failure report and the rerun machine's tracker lines by the reader
given (runmgr/watch/torchrun.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

from runmgr.controller.group import GroupPoll, WorkerFailure, WorkerInfo
from runmgr.watch.megatron_log import LogEvent, MegatronLogReader
from runmgr.watch.observations import CheckpointObservation, LoadedCheckpoint, SaveStarted, StepObservation, WorkerExit
from runmgr.watch.silences import PlannedSilences
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, StepReport

FAILURE_TAIL_LINES = 40
"""Lines of a failed node's output that go into its failure's text."""
VALIDATION_EXIT = 17
"""Megatron's rerun machine: failed result validation (the tracker file names the rank)."""
_BLOCK_EDGE = "====="
_ROOT_CAUSE = "Root Cause (first observed failure):"
_TORCHRUN_TRACEBACK_END = "ChildFailedError"


class TorchrunReader(Protocol):
    """Reads torchrun's failure report (runmgr/watch/torchrun.py; the module itself fits)."""

    def root_cause(self, text: str) -> Any:
        """The first observed failure (``.rank``, ``.exitcode``), or None."""

    def tracker_lines(self, text: str) -> list:
        """The rerun machine's tracker lines in ``text`` (each with ``.rank``)."""


class OutputTranslator:
    """Turns one sub-run's lines into a :class:`GroupPoll`'s reports. Keeps the
    parser's state (the previous step, save starts) for this sub-run only."""

    def __init__(self, plan: ResumePlan, ranks: Sequence[int], reader: MegatronLogReader,
                 checkpoint_dir: Optional[Path], seq_length: Optional[int], start_step: int = 0,
                 silences: Optional[PlannedSilences] = None) -> None:
        """``start_step``: the iteration the sub-run starts from; ``silences``: where its own
        command line makes it silent (told to the watcher when it starts)."""
        self.plan = plan
        self.ranks = tuple(ranks)
        self.reader = reader
        self.checkpoint_dir = checkpoint_dir
        self.seq_length = seq_length
        self.start_step = start_step
        self.silences = silences
        self._save_started: dict[int, float] = {}
        self._finished: set[int] = set()

    def started(self, poll: GroupPoll, at: float) -> None:
        """Every rank beats ``init`` at the start step when its node's command starts; the
        watcher learns the sub-run's planned silences."""
        if self.silences is not None:
            poll.observations.append(self.silences)
        self._beat(poll, "init", self.start_step, at)

    def finished(self, ranks: Sequence[int]) -> None:
        """``ranks`` exited 0: no line of another node speaks for them any more."""
        self._finished.update(ranks)

    def _beat(self, poll: GroupPoll, phase: str, step: int, at: float) -> None:
        """A heartbeat of every rank still running: a line of one rank shows the others alive
        too, as they step together (Megatron prints on the last rank and rank 0 only)."""
        poll.heartbeats += [Heartbeat(rank, phase, step, at) for rank in self.ranks if rank not in self._finished]

    def lines(self, lines: Sequence[tuple[float, str]], poll: GroupPoll) -> None:
        """Parse ``(arrival time, line)`` pairs, in arrival order, into ``poll``."""
        for at, line in sorted(lines, key=lambda pair: pair[0]):
            for event in self._parse(line, at):
                self._handle(event, poll)
            # What the line held that cannot be: for the logbook, under this sub-run's id.
            poll.observations += [dataclasses.replace(refused, subrun=self.plan.subrun)
                                  for refused in self.reader.take_refused()]
        poll.steps.sort(key=lambda report: report.step)

    def _parse(self, line: str, at: float) -> list[LogEvent]:
        """What the line's messages say (two ranks' messages may share a line: megatron_log.messages)."""
        # The plan's id, not the parser's numbering.
        return [dataclasses.replace(event, subrun=self.plan.subrun) for event in self.reader.parse_all(line, at)]

    def _handle(self, event: LogEvent, poll: GroupPoll) -> None:
        if isinstance(event, WorkerExit):
            return  # a death line: the node's exit status reports the failure, with its output
        poll.observations.append(event)
        if isinstance(event, StepObservation):
            poll.steps.append(self._step_report(event))
            self._beat(poll, "step", event.step, event.time)
        elif isinstance(event, SaveStarted):
            self._save_started[event.step] = event.time
            self._beat(poll, "checkpoint", event.step, event.time)
        elif isinstance(event, LoadedCheckpoint):
            self._beat(poll, "init", event.step, event.time)  # loaded: still starting, further along
        elif isinstance(event, CheckpointObservation):
            poll.checkpoints.append(self._checkpoint_report(event))
            # Saved: the ranks are back to their steps, and a silence from here is a step's, not a save's.
            self._beat(poll, "step", event.step, event.time)

    def _step_report(self, obs: StepObservation) -> StepReport:
        """The step as the logbook records it: what the line did not give (or gave absurdly, and
        the reader refused) is NaN, or None for its position, never a value made up."""
        known = lambda value, default: default if value is None else value  # noqa: E731
        tokens = obs.global_batch * self.seq_length if obs.global_batch and self.seq_length else 0
        return StepReport(
            subrun=self.plan.subrun, step=obs.step, loss=known(obs.loss, math.nan),
            grad_norm=known(obs.grad_norm, math.nan), lr=known(obs.lr, math.nan),
            loss_scale=known(obs.loss_scale, math.nan), tokens=tokens,
            consumed_samples=obs.consumed_samples,  # type: ignore[arg-type]  # None: not known
            step_time=known(obs.step_time, 0.0), compute_times=(), skipped=obs.skipped, time=obs.time)

    def _checkpoint_report(self, obs: CheckpointObservation) -> CheckpointReport:
        started = self._save_started.get(obs.step)
        return CheckpointReport(subrun=self.plan.subrun, step=obs.step, path=self.checkpoint_path(obs.step),
                                seconds=obs.time - started if started is not None else 0.0, time=obs.time)

    def checkpoint_path(self, step: int) -> str:
        """The built-in trainer's ``step_%08d`` when it exists there, else Megatron's ``iter_%07d``."""
        if self.checkpoint_dir is None:
            return ""
        ours = self.checkpoint_dir / f"step_{step:08d}"
        return str(ours if ours.exists() else self.checkpoint_dir / f"iter_{step:07d}")


def node_failure(node_ranks: Sequence[int], exit_code: int, tail: Sequence[str], tracker: Sequence[str],
                 torchrun: TorchrunReader, worker_of: Callable[[int], Optional[WorkerInfo]], at: float) -> WorkerFailure:
    """One failure for a node whose torchrun exited with ``exit_code`` (non-zero). The rank
    blamed: the tracker's for a failed validation, else torchrun's root cause, else the
    node's first. Its text: what the rank's exit was, torchrun's root-cause block, the
    output's last lines and the tracker lines of the sub-run."""
    lines = list(tail)
    cause = torchrun.root_cause("\n".join(lines))
    code = cause.exitcode if cause is not None and cause.exitcode is not None else exit_code
    rejected = torchrun.tracker_lines("\n".join(tracker)) if tracker else []
    if code == VALIDATION_EXIT and rejected:
        rank = int(rejected[0].rank)
    elif cause is not None and cause.rank is not None:
        rank = int(cause.rank)
    else:
        rank = node_ranks[0]
    block, rest = split_root_cause(lines)
    parts = [f"rank {rank} exited with code {code}", *block, *rest[-FAILURE_TAIL_LINES:], *tracker]
    return WorkerFailure(rank, "error", "\n".join(parts), worker_of(rank), at, exit_code=code,
                         output=tuple(rest[-FAILURE_TAIL_LINES:]))


def split_root_cause(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """torchrun's last failure report (the ``=====`` block holding the root cause) and
    the other lines, without torchrun's own traceback (it says only that a child failed)."""
    lines = list(lines)
    marks = [i for i, line in enumerate(lines) if _ROOT_CAUSE in line]
    block: list[str] = []
    if marks:
        start = next((i for i in range(marks[-1], -1, -1) if lines[i].startswith(_BLOCK_EDGE)), marks[-1])
        end = next((i for i in range(marks[-1], len(lines)) if lines[i].startswith(_BLOCK_EDGE)), len(lines) - 1)
        block, lines = lines[start:end + 1], lines[:start] + lines[end + 1:]
    return block, _without_torchrun_traceback(lines)


def _without_torchrun_traceback(lines: list[str]) -> list[str]:
    ends = [i for i, line in enumerate(lines) if _TORCHRUN_TRACEBACK_END in line and "Error:" in line]
    if not ends:
        return lines
    starts = [i for i in range(ends[-1]) if lines[i].startswith("Traceback (most recent call last):")]
    return lines[:starts[-1]] + lines[ends[-1] + 1:] if starts else lines
