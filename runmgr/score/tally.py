"""What the follower's calls on a labelled log were worth: each label found or missed, how late,
whether what runmgr would have done is the labelled remedy; every incident no label explains is
a false alarm, counted apart when its decision would have acted (a rollback, a restart, a page).

An incident explains a label when its kind is one of the label's and its onset (or, without one,
the step it was decided at) lies within the label's window (runmgr/score/labels.py); of several
such labels, the one whose onset is nearest. The first
such incident finds the label; the others (a grad-norm spike beside the loss spike, the same
hang seen again) are the same event, not false alarms. What runmgr would have done about a label
is the first of its incidents' decisions that acts, else ``ignore``: a self-recovering spike that
no detector even recorded was rightly left alone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from runmgr.score.labels import Label, LogLabels
from runmgr.score.playback import Call

IGNORE = "ignore"


@dataclass(frozen=True)
class Outcome:
    """One label and what the follower made of it."""

    log: str
    label: Label
    found: Optional[Call]
    """The first incident that explains it (None: missed)."""
    action: str
    """What runmgr would have done about it."""
    delay_steps: Optional[int] = None
    """Iterations from the labelled onset to the decision."""
    delay_s: Optional[float] = None
    """Seconds from the labelled onset's line to the decision."""

    @property
    def right(self) -> bool:
        return self.action in self.label.remedy


@dataclass(frozen=True)
class LogScore:
    """One log's outcomes and false alarms."""

    log: str
    labels: LogLabels
    steps: int
    """Iterations the log covers (its last logged iteration less its first, plus one)."""
    outcomes: tuple[Outcome, ...]
    false_alarms: tuple[Call, ...]


def score_log(log: str, labels: LogLabels, calls: Sequence[Call], step_times: dict[int, float]) -> LogScore:
    """Match ``calls`` against ``labels`` (``step_times``: when each iteration's line was written)."""
    owner = [_nearest(labels.incidents, call) for call in calls]
    outcomes = tuple(_outcome(log, label, [c for c, o in zip(calls, owner) if o is label], step_times)
                     for label in labels.incidents)
    steps = (max(step_times) - min(step_times) + 1) if step_times else 0
    return LogScore(log, labels, steps, outcomes, tuple(c for c, o in zip(calls, owner) if o is None))


def _nearest(labels: Sequence[Label], call: Call) -> Optional[Label]:
    """The label ``call`` explains: of those whose kind and window it fits, the one whose onset is
    nearest (two spikes 100 steps apart each explain their own incident)."""
    kind, step = call.judgement.incident.kind, _step_of(call)
    fitting = [label for label in labels if label.explains(kind, step)]
    return min(fitting, key=lambda label: abs(label.step - step), default=None)


def _step_of(call: Call) -> int:
    onset = call.judgement.incident.onset_step
    return onset if onset is not None else (call.step or 0)


def _outcome(log: str, label: Label, mine: list[Call], step_times: dict[int, float]) -> Outcome:
    if not mine:
        return Outcome(log, label, None, IGNORE)
    first = mine[0]
    acting = next((c for c in mine if c.judgement.decision.action != IGNORE), None)
    action = str(acting.judgement.decision.action) if acting is not None else IGNORE
    decided = acting or first
    onset_at = _time_at(step_times, label.step)
    return Outcome(log, label, first, action,
                   delay_steps=(decided.step - label.step) if decided.step is not None else None,
                   delay_s=(decided.at - onset_at) if onset_at is not None else None)


def _time_at(step_times: dict[int, float], step: int) -> Optional[float]:
    """When the first logged iteration at or after ``step`` was written."""
    later = [s for s in step_times if s >= step]
    return step_times[min(later)] if later else None


@dataclass
class ClassRow:
    """The table's row for one class of labelled incident."""

    cls: str
    logs: set[str] = field(default_factory=set)
    labelled: int = 0
    found: int = 0
    right: int = 0
    delays_steps: list[int] = field(default_factory=list)
    delays_s: list[float] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)

    @property
    def missed(self) -> int:
        return self.labelled - self.found


@dataclass
class FalseAlarmRow:
    """False alarms of one incident kind."""

    kind: str
    all: int = 0
    acted: int = 0
    on_clean: int = 0
    acted_on_clean: int = 0


@dataclass
class Corpus:
    """The whole folder's score."""

    logs: list[LogScore]

    def classes(self) -> list[ClassRow]:
        rows: dict[str, ClassRow] = {}
        for log in self.logs:
            for outcome in log.outcomes:
                row = rows.setdefault(outcome.label.cls, ClassRow(outcome.label.cls))
                row.logs.add(log.log)
                row.labelled += 1
                row.found += outcome.found is not None
                row.right += outcome.right
                row.actions[outcome.action] = row.actions.get(outcome.action, 0) + 1
                if outcome.found is not None and outcome.delay_steps is not None:
                    row.delays_steps.append(outcome.delay_steps)
                if outcome.found is not None and outcome.delay_s is not None:
                    row.delays_s.append(outcome.delay_s)
        return sorted(rows.values(), key=lambda row: row.cls)

    def false_alarms(self) -> list[FalseAlarmRow]:
        rows: dict[str, FalseAlarmRow] = {}
        for log in self.logs:
            for call in log.false_alarms:
                row = rows.setdefault(str(call.judgement.incident.kind), FalseAlarmRow(str(call.judgement.incident.kind)))
                acted = call.judgement.decision.action != IGNORE
                row.all += 1
                row.acted += acted
                row.on_clean += log.labels.clean
                row.acted_on_clean += acted and log.labels.clean
        return sorted(rows.values(), key=lambda row: row.kind)

    def clean_steps(self) -> int:
        return sum(log.steps for log in self.logs if log.labels.clean)


def median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None
