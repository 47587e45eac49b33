"""Warm recovery in plain data parallel: a replica's live state is the copy, no snapshot is
taken (trainer/live.py says why that holds)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from trainer import host_state
from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.live import Committed, agree_on_live_step
from trainer.recovery.regroup import WarmRecovery
from trainer.recovery.state import capture, restore
from trainer.report import StepReport
from trainer.session import Position, Session
from trainer.rejoin import Rejoin, WarmLink


class LiveRecovery(WarmRecovery):
    """Each rank tracks the step its live state is committed at, with the reports of its last
    steps; when a peer dies, the re-formed group resumes at the newest committed step a survivor
    holds, its lowest holder sending its live state to the ranks without it."""

    keeps_reports = True

    def __init__(self, link: WarmLink, config: TrainerConfig, device: Device) -> None:
        super().__init__(link, config, device)
        self.committed: Optional[Committed] = None
        """Where this rank's live state stands (set before the first step)."""

    def on_start(self, session: Session) -> None:
        self.committed = Committed(session.ctx.start_step, session.position.cursor, session.position.skipped_samples)

    def on_commit(self, session: Session, step: int, report: Optional[StepReport]) -> None:
        self._held().commit(step, session.position.cursor, session.position.skipped_samples, report)

    def newest_step(self) -> Optional[int]:
        return self._held().step

    def _resume(self, session: Session, rejoin: Rejoin) -> int:
        committed, env = self._held(), rejoin.dist_env
        # The failed step moved the data position before its collectives: put it back.
        session.position = Position(committed.cursor, committed.skipped_samples)
        agreed = agree_on_live_step(committed.step, env.world_size, session.ctx.device.torch_device)
        if env.rank == agreed.donor:
            self._donate(session, agreed.receivers)
        elif env.rank in agreed.receivers:
            received, extra = host_state.receive(agreed.donor, self.host_group)
            state = {**received.unpack(), **extra}
            restore(session, state)
            self._stand_at(session, agreed.step, state)
        return agreed.step

    def _resumed(self, session: Session, rejoin: Rejoin, step: int) -> None:
        self._report_again(session, rejoin.at_most)

    def spare_source(self, rejoin: Rejoin, device: torch.device) -> tuple[int, int]:
        agreed = agree_on_live_step(None, rejoin.dist_env.world_size, device)
        return agreed.step, agreed.donor

    def spare_joined(self, session: Session, rejoin: Rejoin, step: int, state: dict) -> None:
        self._stand_at(session, step, state)
        self._report_again(session, rejoin.at_most)

    def _held(self) -> Committed:
        assert self.committed is not None, "on_start (or a spare's join) sets it before the first step"
        return self.committed

    def _stand_at(self, session: Session, step: int, state: dict) -> None:
        """A receiver's live state now stands where the donor's does, reports included."""
        self.committed = Committed(step, session.position.cursor, session.position.skipped_samples)
        self.committed.reports.extend(StepReport.from_dict(report) for report in state["reports"])

    def _donate(self, session: Session, receivers: tuple[int, ...]) -> None:
        """Send this rank's live state (one host copy, taken now) to each of ``receivers``, with the
        losses so far and the kept step reports."""
        held = host_state.take(capture(session))
        extra = {"losses": list(session.losses), "reports": [report.to_dict() for report in self._held().reports]}
        for receiver in receivers:
            host_state.send(held, receiver, self.host_group, extra=extra)

    def _report_again(self, session: Session, recorded: Optional[int]) -> None:
        """Rank 0 of the re-formed group reports, under its new sub-run, the steps after ``recorded``
        (the newest step the driver recorded) that the group resumes past."""
        if session.ctx.dist_env.rank != 0:
            return
        for report in self._held().reports_after(recorded):
            session.setup.reporter.step(replace(report, subrun=session.ctx.plan.subrun))
