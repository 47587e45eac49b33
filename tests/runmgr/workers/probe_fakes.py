"""In-process stand-ins for what the lost-node probe (runmgr/workers/liveness.py) awaits: a clock
the test moves, and calls whose answers are already there or never come (a node that is gone).
A wait for answers that do not all come moves the clock by the whole wait, as a real wait would
take it: the probe's rules run on the test's time, never the machine's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, eq=False)
class Call:
    """One probe call: its answer, or None (its agent's node is gone: no answer ever comes)."""

    to: Any
    answer: Optional[Any]


@dataclass
class FakeAnswers:
    """The probe's :class:`runmgr.workers.liveness.Answers` over :class:`Call` objects."""

    clock: FakeClock

    def ready(self, calls: list, timeout_s: float) -> list:
        done = [call for call in calls if call.answer is not None]
        if len(done) < len(calls):
            self.clock.now += timeout_s  # the wait ran out
        return done

    def value(self, call: Call) -> Any:
        return call.answer
