"""Which checkpoints are kept: the driver decides, never its workers.

Under runmgr the trainer deletes no checkpoint (the driver hands it
``checkpoint.keep_last=0``). Once the logbook has recorded checkpoint N (this
observer comes after the logbook writer), the driver deletes the checkpoints
before N beyond the newest ``checkpoint.keep_last`` complete ones, and the
leftovers of saves that never finished before N. It never deletes:

- N, nor anything newer: a checkpoint still in flight, or one the logbook
  has not recorded, is not the driver's to judge yet;
- the checkpoint an instability seen now would roll back to: the newest one
  at least ``policy.rollback.margin_steps`` plus the spike detectors' grace
  before the newest recorded step (the policy's rule, with the steps a spike
  may take to be judged), so that a small ``keep_last`` does not turn a
  rollback into a start from scratch or a stop for a person;
- with a durable tier (``checkpoint.s3``), a checkpoint whose S3 copy has not
  verified yet (an outage keeps them all, beyond ``keep_last``); retention
  looks again each time a copy verifies.

A driver that dies deletes nothing more, and its workers stop before they
write or commit another checkpoint (runmgr/workers/actor.py): the newest
checkpoint the driver recorded is always there for the relaunch, which then
loses at most the steps since it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional, Protocol

from runmgr.config.schema import RunConfig
from runmgr.controller.group import GroupPoll
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Launching, Running, State
from runmgr.policy.checkpoints import newest
from runmgr.resume import listed_checkpoints
from trainer.config import TrainerConfig
from trainer.manifest import checkpoint_dir, list_checkpoints, prune_checkpoints, step_of


class Durability(Protocol):
    """Which checkpoints have a verified durable copy (the S3 mirror)."""

    def is_durable(self, step: int) -> bool: ...

    def durable_count(self) -> int: ...


def trainer_keeps_everything(config: TrainerConfig) -> TrainerConfig:
    """The trainer's config under runmgr: it deletes no checkpoint, the driver does."""
    return replace(config, checkpoint=replace(config.checkpoint, keep_last=0))


def rollback_reach_steps(config: RunConfig) -> int:
    """How far before the newest recorded step a rollback decided now may reach:
    the policy's margin before the onset, plus the steps a spike may last before
    it is judged (its grace), the onset lying that far back."""
    watcher = config.watcher
    return config.policy.rollback.margin_steps + max(watcher.loss_spike.grace_steps, watcher.grad_spike.grace_steps)


class RetentionObserver:
    """Deletes the checkpoints the lineage no longer needs, after the logbook recorded a newer one."""

    def __init__(self, save_dir: Path, keep_last: int, rollback_reach: int,
                 durable: Optional[Durability] = None) -> None:
        """``keep_last``: complete checkpoints kept (0: every one); ``rollback_reach``: see
        :func:`rollback_reach_steps`; ``durable``: the S3 mirror, when there is one."""
        self.save_dir = Path(save_dir)
        self.keep_last = keep_last
        self.rollback_reach = rollback_reach
        self.durable = durable
        self.recorded_step = 0
        self.newest_recorded: Optional[int] = None
        self._durable_seen = 0
        self.deleted: list[Path] = []
        """Every checkpoint this driver deleted, oldest first (for tests and the curious)."""

    def on_transition(self, old: State | None, new: State) -> None:
        if isinstance(new, Launching):
            # A rollback starts the lineage again from new.start_step: the steps after it are redone.
            self.recorded_step = new.start_step
            if self.newest_recorded is not None:  # the newer ones were retired with their branch
                self.newest_recorded = min(self.newest_recorded, new.start_step)

    def on_judgement(self, state: Running | Launching, judgement: Judgement) -> None:
        """Retention does not depend on judgements: the rollback target is protected beforehand."""

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        if poll.steps:
            self.recorded_step = max(self.recorded_step, poll.steps[-1].step)
        if poll.checkpoints:
            self.newest_recorded = max(report.step for report in poll.checkpoints)
        if self.keep_last > 0 and self.newest_recorded is not None and (poll.checkpoints or self._more_durable()):
            self.prune(self.newest_recorded)

    def _more_durable(self) -> bool:
        """True when a durable copy verified since the last look (its local copy may go now)."""
        if self.durable is None:
            return False
        count = self.durable.durable_count()
        more, self._durable_seen = count > self._durable_seen, count
        return more

    def prune(self, newest_recorded: int) -> list[Path]:
        """Delete what the lineage no longer needs, looking no further than
        ``newest_recorded`` (the newest checkpoint the logbook recorded)."""
        target = newest(listed_checkpoints(self.save_dir, self.recorded_step - self.rollback_reach))
        protect = (checkpoint_dir(self.save_dir, target.step),) if target is not None else ()
        if self.durable is not None:
            protect += tuple(path for path in list_checkpoints(self.save_dir)
                             if not self.durable.is_durable(step_of(path) or 0))
        deleted = prune_checkpoints(self.save_dir, self.keep_last, protect=protect, up_to_step=newest_recorded)
        self.deleted += deleted
        return deleted
