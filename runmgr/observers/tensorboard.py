"""Each step's metrics, and each incident, decision and sub-run start and end, as
TensorBoard event files (``metrics.tensorboard``), written with the
``tensorboard`` package's own writer through ``torch.utils.tensorboard``.

One TensorBoard run per sub-run: sub-run ``12.01`` writes into ``<dir>/12.01/``.
A rollback's sub-run trains steps again that its predecessor already wrote; in
one event stream the curve would run back from step 640 to 500 and draw a
zig-zag, and ``purge_step`` would instead hide the steps the rollback threw
away. As separate runs, TensorBoard draws each sub-run as its own line (as
``runmgr logbook plot`` colours them), the thrown-away steps stay visible as
the tail of their own sub-run, and a relaunch adds folders without touching
those already written. The global step is the training step; each point's
wall time is the trainer's own time for that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Failed, Finished, Launching, Restarting, Running, State
from runmgr.observers.logbook_writer import tokens_per_s
from runmgr.controller.group import GroupPoll

FLUSH_SECS = 10
"""Events reach the file at most this many seconds after they are written (the writer's own
default, 120 s, is too slow for a dashboard a person watches while the run trains)."""
INCIDENTS_TAG = "incidents"
"""The text tag of incidents and their decisions (TensorBoard's Text tab)."""
SUBRUNS_TAG = "subruns"
"""The text tag of sub-run starts and ends."""


def step_scalars(report) -> dict[str, float]:
    """Tag -> value of one step report: what the logbook records for it, less the counters.
    A measurement the trainer did not make (MFU on CPU, memory) is left out, not written as 0."""
    peak = max(getattr(report, "peak_memory_bytes", ()) or (0,))
    values = {"train/loss": report.loss, "train/grad_norm": report.grad_norm, "train/lr": report.lr,
              "train/loss_scale": report.loss_scale, "perf/tokens_per_s": tokens_per_s(report),
              "perf/step_time_s": report.step_time, "perf/mfu": getattr(report, "mfu", None),
              "perf/peak_memory_gib": peak / 2 ** 30 if peak else None}
    return {tag: float(value) for tag, value in values.items() if value is not None}


def summary_writer(log_dir: Path):
    """The tensorboard package's writer (torch's front end to it) for one sub-run's folder."""
    from torch.utils.tensorboard import SummaryWriter  # the tensorboard package: only when enabled

    return SummaryWriter(log_dir=str(log_dir), flush_secs=FLUSH_SECS)


class TensorBoardObserver:
    """Writes the run for TensorBoard, one writer (one TensorBoard run) per sub-run, under ``log_dir``."""

    def __init__(self, log_dir: Path, writer_for: Callable[[Path], object] = summary_writer) -> None:
        self.log_dir = Path(log_dir)
        self._writer_for = writer_for
        self._writers: dict[str, object] = {}
        self._last_step: dict[str, int] = {}

    def on_transition(self, old: Optional[State], new: State) -> None:
        if isinstance(new, Launching):
            self._last_step[new.subrun] = new.start_step
            self._writer(new.subrun).add_text(
                SUBRUNS_TAG, f"**{new.subrun}** started at step {new.start_step}: {_first_line(new.cause)}",
                new.start_step)
        elif isinstance(new, (Restarting, Finished, Failed)):
            self._writer(new.subrun).add_text(SUBRUNS_TAG, _ending(new), new.last_step)
            self._close(new.subrun)

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        if not poll.steps:
            return
        writer = self._writer(state.subrun)
        for report in poll.steps:
            for tag, value in step_scalars(report).items():
                writer.add_scalar(tag, value, report.step, walltime=report.time)
            self._last_step[state.subrun] = report.step

    def on_judgement(self, state, judgement: Judgement) -> None:
        incident, decision = judgement.incident, judgement.decision
        # An incident with no step of its own (a worker died) sits after the last step reported.
        step = incident.onset_step if incident.onset_step is not None else self._last_step.get(state.subrun, 0)
        self._writer(state.subrun).add_text(
            INCIDENTS_TAG, f"**{incident.summary()}**\n\ndecision: **{decision.action}**: {decision.reason}", step)

    def close(self) -> None:
        """Flush and close every writer still open (the driver stops)."""
        for subrun in list(self._writers):
            self._close(subrun)

    def _writer(self, subrun: str):
        if subrun not in self._writers:
            self._writers[subrun] = self._writer_for(self.log_dir / subrun)
        return self._writers[subrun]

    def _close(self, subrun: str) -> None:
        writer = self._writers.pop(subrun, None)
        if writer is not None:
            writer.close()


def _ending(state: Restarting | Finished | Failed) -> str:
    if isinstance(state, Finished):
        return f"**{state.subrun}** finished at step {state.last_step}"
    if isinstance(state, Failed):
        return f"**{state.subrun}** failed at step {state.last_step}: {state.reason}"
    return (f"**{state.subrun}** ended at step {state.last_step}: {state.judgement.decision.action} for the "
            f"{state.judgement.incident.summary()}")


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""
