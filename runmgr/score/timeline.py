"""A recorded log played back as if it were being written: each line at the time the job wrote it,
a clock that the player moves, and a source that gives a follower the lines written by then.

A line's time is its own stamp (``[2024-09-03 16:02:57]``, or Megatron's ``print_datetime``:
``[after model, optimizer, and learning rate scheduler are built] datetime: 2024-09-03 16:02:57``,
which a restarted job prints before it loads its checkpoint), or, without one, the log's clock as
runmgr's reader keeps it: the last stamp plus the elapsed time per iteration of the iterations
since (runmgr/watch/megatron_log.py). Times never go back (a line stamped earlier than the one
before it is taken at the one before's time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional, Sequence

from runmgr.shadow.lines import Line
from runmgr.watch.megatron_log import MegatronLogReader, stamp_seconds
from runmgr.watch.observations import StepObservation


_PRINT_DATETIME = re.compile(r"\] datetime: (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
"""Megatron's ``print_datetime`` (training.py): ``'[' + string + '] datetime: {} '`` with
``%Y-%m-%d %H:%M:%S`` in the job's local time, read as UTC like the iteration lines' stamps."""


def datetime_seconds(line: str) -> Optional[float]:
    """Unix seconds of a ``print_datetime`` line (None: not one)."""
    match = _PRINT_DATETIME.search(line)
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def timed_lines(lines: Sequence[str]) -> list[Line]:
    """Each line (without its newline) with the time it was written."""
    reader = MegatronLogReader()
    timed: list[Line] = []
    now = 0.0
    shift = 0.0
    """What ``print_datetime`` lines moved the clock past the reader's own (which knows only the
    iteration lines' stamps and elapsed times): added to the reader's times until a stamp re-anchors it."""
    for raw in lines:
        line = raw.rstrip("\r\n")
        event = reader.parse(line)
        reader.take_refused()
        stamped = stamp_seconds(line)
        if stamped is not None:
            at, shift = stamped, 0.0
        elif getattr(event, "time", None) is not None:
            at = event.time + shift
        else:
            at = datetime_seconds(line)
            if at is not None and at > now:
                shift += at - now
        if at is not None:
            now = max(now, float(at))
        timed.append((now, line))
    return _from_the_first_time(timed)


def _from_the_first_time(timed: list[Line]) -> list[Line]:
    """The lines before the log's first time (a job's preamble: its arguments, the model being
    built) are at that first time, not at 0: a player would wait for them since 1970."""
    first = next((at for at, _ in timed if at > 0.0), None)
    if first is None:
        return timed
    return [(first if at == 0.0 else at, line) for at, line in timed]


def step_times(timed: Sequence[Line]) -> dict[int, float]:
    """When each logged iteration's line was written (a restarted job's repeat: its first time)."""
    reader = MegatronLogReader()
    seen: dict[int, float] = {}
    for at, line in timed:
        event = reader.parse(line, received_at=at)
        reader.take_refused()
        if isinstance(event, StepObservation):
            seen.setdefault(event.step, at)
    return seen


@dataclass
class PlayedLog:
    """A :class:`runmgr.shadow.lines.LineSource` over timed lines: ``take()`` gives the lines
    written up to the player's clock (``now``), in order."""

    lines: Sequence[Line]
    name: str
    now: float = 0.0
    _next: int = 0

    def take(self) -> list[Line]:
        start = self._next
        while self._next < len(self.lines) and self.lines[self._next][0] <= self.now:
            self._next += 1
        return list(self.lines[start:self._next])

    def next_line_at(self) -> Optional[float]:
        """When the next line not yet taken was written (None: all were)."""
        return self.lines[self._next][0] if self._next < len(self.lines) else None

    def clock(self) -> float:
        return self.now

    def position(self) -> dict:
        return {"line": self._next}

    def restore(self, position: dict) -> None:
        self._next = int(position.get("line", 0))

    def describe(self) -> str:
        return f"{self.name} (played back)"
