"""Live progress in the terminal: sub-run, step/total, loss, tokens/s, MFU, peak memory, ETA,
last incident. One line redrawn in place on a terminal; a line every few
seconds (and at every transition) when the output is a file or a pipe."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from runmgr.controller.states import AwaitingApproval, Failed, Finished, Launching, Restarting, Running, State
from runmgr.controller.judgement import Judgement
from runmgr.controller.group import GroupPoll
from runmgr.observers.logbook_writer import tokens_per_s


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


CONSOLE_OUTPUT_LINES = 10
"""Of the job's last lines an incident kept, how many the console shows under it."""


class ProgressObserver:
    """Prints progress; never touches the run."""

    def __init__(self, train_iters: int, out: TextIO = sys.stdout, clock: Callable[[], float] = time.time,
                 line_every_s: float = 5.0) -> None:
        self.train_iters = train_iters
        self.out = out
        self.clock = clock
        self.line_every_s = line_every_s
        self.live = hasattr(out, "isatty") and out.isatty()
        self.last_incident = "none"
        self.subrun = "-"
        self._step = 0
        self._loss = float("nan")
        self._tokens_per_s = 0.0
        self._mfu: float | None = None
        self._peak_memory = 0
        self._step_time_ema: float | None = None
        self._last_line = 0.0

    def on_transition(self, old: State | None, new: State) -> None:
        self.subrun = new.subrun
        if isinstance(new, Launching):
            # The cause is told in full with its incident; here only what it was.
            self._event(f"sub-run {new.subrun}: starting from step {new.start_step} ({new.cause.split(': ')[0]})")
        elif isinstance(new, Running) and new.declined is not None:
            self._event(f"sub-run {new.subrun}: {new.declined.by} declined the held remedy; going on")
        elif isinstance(new, AwaitingApproval):
            decision = new.judgement.decision
            self._event(f"sub-run {new.subrun}: waiting for a person to approve {decision.action} "
                        f"(`runmgr approve RUN` or `runmgr decline RUN`); training goes on")
        elif isinstance(new, Running):
            pids = ", ".join(f"rank {w.rank} pid {w.pid}" for w in new.workers)
            count = f"{len(new.workers)} worker{'s' if len(new.workers) != 1 else ''}"
            self._event(f"sub-run {new.subrun}: {count} up ({pids})")
        elif isinstance(new, Restarting):
            decision = new.judgement.decision
            self._event(f"sub-run {new.subrun} ends at step {new.last_step}: {decision.action}")
        elif isinstance(new, Finished):
            self._event(f"finished: sub-run {new.subrun} reached step {new.last_step}")
        elif isinstance(new, Failed):
            self._event(f"FAILED in sub-run {new.subrun} at step {new.last_step}: {new.reason}")

    def on_judgement(self, state: Running, judgement: Judgement) -> None:
        incident, decision = judgement.incident, judgement.decision
        # A death or a device fault has no onset step: say when it was seen instead.
        when = f"at step {incident.onset_step}" if incident.onset_step is not None else f"after step {self._step}"
        self.last_incident = f"{incident.kind} {when} -> {decision.action}"
        self._event(f"incident: {incident.summary()}")
        output = incident.evidence.get("last_output") or ()
        if output:
            shown = list(output)[-CONSOLE_OUTPUT_LINES:]
            more = (f"; `runmgr logbook show RUN --full` has all {len(output)} kept" if len(output) > len(shown)
                    else "")
            self._event(f"  last output of the job (its last {len(shown)} line(s){more}):")
            for line in shown:
                self.out.write(f"    | {line}\n")
        self._event(f"  decision: {decision.action}: {decision.reason}")

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        for report in poll.steps:
            self._step, self._loss = report.step, report.loss
            self._mfu = getattr(report, "mfu", None)
            self._peak_memory = max(getattr(report, "peak_memory_bytes", ()) or (0,))
            if report.step_time > 0:
                self._tokens_per_s = tokens_per_s(report)
                ema = self._step_time_ema
                self._step_time_ema = report.step_time if ema is None else 0.9 * ema + 0.1 * report.step_time
        if poll.steps:
            self._progress()

    def line(self) -> str:
        eta = "?" if self._step_time_ema is None else format_duration((self.train_iters - self._step) * self._step_time_ema)
        return (f"[{self.subrun}] step {self._step}/{self.train_iters} | loss {self._loss:.4f} | "
                f"{self._tokens_per_s:,.0f} tok/s | MFU {mfu_text(self._mfu)} | "
                f"peak mem {memory_text(self._peak_memory)} | ETA {eta} | last incident: {self.last_incident}")

    def _progress(self) -> None:
        now = self.clock()
        if self.live:
            self.out.write("\r\033[K" + self.line())
            self.out.flush()
        elif now - self._last_line >= self.line_every_s or self._step >= self.train_iters:
            self._last_line = now
            self.out.write(self.line() + "\n")
            self.out.flush()

    def _event(self, text: str) -> None:
        prefix = "\r\033[K" if self.live else ""
        self.out.write(f"{prefix}{time.strftime('%H:%M:%S', time.localtime(self.clock()))} {text}\n")
        self.out.flush()


def mfu_text(mfu: float | None) -> str:
    """``41.2%``; ``n/a`` where the device's peak is unknown (CPU)."""
    return "n/a" if mfu is None else f"{100 * mfu:.1f}%"


def memory_text(nbytes: int) -> str:
    """The largest rank's peak memory (``1.25 GiB``); ``n/a`` when not measured."""
    if nbytes <= 0:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes / 1024:.0f} KiB"
