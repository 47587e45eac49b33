"""The controller's states. Each carries what the next transition needs, so
a state can be logged, inspected in tests and resumed from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from runmgr.controller.group import WarmStart
from runmgr.controller.judgement import Judgement
from trainer.plan import ResumePlan


@dataclass(frozen=True)
class Launching:
    """A sub-run is about to start from ``plan``."""

    subrun: str
    plan: ResumePlan
    start_step: int
    cause: str
    evidence: dict = field(default_factory=dict)
    warm: Optional[WarmStart] = None
    """A warm restart: the running group replaces these ranks (None: new ranks, cold)."""


@dataclass(frozen=True)
class Verdict:
    """A person's answer to a held remedy (``runmgr approve`` / ``runmgr decline``)."""

    approved: bool
    by: str
    """Who answered (the user that ran the command)."""
    at: float


@dataclass(frozen=True)
class Running:
    """The ranks of ``subrun`` are training."""

    subrun: str
    plan: ResumePlan
    start_step: int
    workers: tuple = ()
    declined: Optional[Verdict] = None
    """The held remedy a person just declined (after :class:`AwaitingApproval`); None otherwise."""


@dataclass(frozen=True)
class AwaitingApproval:
    """The ranks of ``subrun`` go on training while a remedy runmgr may not take by itself
    (``policy.act_on``) waits for a person: ``runmgr approve`` or ``runmgr decline``."""

    subrun: str
    plan: ResumePlan
    start_step: int
    workers: tuple
    judgement: Judgement
    """The incident and the held decision."""


@dataclass(frozen=True)
class Restarting:
    """``subrun`` ends early because of ``judgement``; the next sub-run follows its decision."""

    subrun: str
    plan: ResumePlan
    judgement: Judgement
    last_step: int
    also_exclude: tuple[str, ...] = ()
    """Nodes that any decision of the poll that ended the sub-run excluded (an ECC error
    seen in the poll that also ended it for a spike): the next sub-run avoids them too."""
    also_resize: Optional[int] = None
    """The smallest data-parallel size any decision of that poll asked for."""
    approval: Optional[Verdict] = None
    """The person who approved the decision, when it was held for one."""


@dataclass(frozen=True)
class Finished:
    """The run trained all its steps."""

    subrun: str
    last_step: int


@dataclass(frozen=True)
class Failed:
    """The run stopped and needs a person; ``reason`` says what to look at."""

    subrun: str
    reason: str
    last_step: int


State = Launching | Running | AwaitingApproval | Restarting | Finished | Failed

ALLOWED: dict[type, tuple[type, ...]] = {
    Launching: (Running, Restarting, Failed),
    Running: (Running, AwaitingApproval, Restarting, Finished, Failed),
    AwaitingApproval: (Running, Restarting, Finished, Failed),
    Restarting: (Launching, Failed),
    Finished: (),
    Failed: (),
}


def is_terminal(state: State) -> bool:
    return not ALLOWED[type(state)]
