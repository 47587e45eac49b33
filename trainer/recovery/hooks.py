"""What the training loop asks of fault tolerance: four hooks, and the default that survives nothing.

The loop (trainer/loop.py) calls them at fixed points of a sub-run on this rank:

- :meth:`Recovery.on_start` once, after the session is built, before the first step;
- :meth:`Recovery.on_commit` when a step's update is done (a dummy iteration: at once),
  before the step's checkpoint phase;
- :meth:`Recovery.after_step` when a step is done, its checkpoint phase too;
- :meth:`Recovery.on_failure` when a step (or :meth:`Recovery.after_step`) raised a
  RuntimeError: it resumes the session at a step, or declines and the loop raises.

A recovery keeps its own state; it changes the loop's (trainer/session.py) only in
:meth:`Recovery.on_failure`, to put it where the resumed run stands.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.distributed import DistEnv
from trainer.report import StepReport
from trainer.session import Session


class Recovery(Protocol):
    """How a rank survives a failure without leaving the training loop."""

    keeps_reports: bool
    """Every rank builds its step reports (not only rank 0, which sends them) and hands them to
    :meth:`on_commit`: a rank that becomes rank 0's stand-in may have to report them again."""

    def on_start(self, session: Session) -> None:
        """The session stands at ``session.ctx.start_step`` and takes its first step next."""

    def on_commit(self, session: Session, step: int, report: Optional[StepReport]) -> None:
        """``step``'s update is done: nothing of it is collective any more, but a checkpoint's
        save. ``report``: the step's report when this rank built one."""

    def after_step(self, session: Session, step: int) -> None:
        """``step`` is done, its checkpoint phase too."""

    def on_failure(self, session: Session, error: RuntimeError) -> Optional[int]:
        """A step failed with ``error``. Returns the step the session now stands at (the loop
        goes on with the one after), or None: not survivable here, the loop raises ``error``."""


RecoveryFactory = Callable[[TrainerConfig, Device, DistEnv], Recovery]
"""Builds a rank's recovery right after its process groups start and before its model is
built (a warm recovery creates a process group of its own there: every rank must, in the
same order)."""


class NoRecovery:
    """The default: nothing is survived in the process; every failure goes to the caller
    (whoever drives the rank restarts it, from a checkpoint)."""

    keeps_reports = False

    def on_start(self, session: Session) -> None:
        pass

    def on_commit(self, session: Session, step: int, report: Optional[StepReport]) -> None:
        pass

    def after_step(self, session: Session, step: int) -> None:
        pass

    def on_failure(self, session: Session, error: RuntimeError) -> Optional[int]:
        return None

