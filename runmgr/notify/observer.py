"""What of a run is sent to its webhooks: a run that stopped for a person, a shadow run's
recommendations (of the kinds chosen), and with ``notify.every_incident`` every incident. The
logbook records each delivery (``notified``) and each failure (``notification_failed``)."""

from __future__ import annotations

import time
from typing import Optional

from logbook import Logbook
from runmgr.config.schema import RunConfig
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import AwaitingApproval, Failed, State
from runmgr.notify.sender import Notification, Notifier
from runmgr.notify.targets import Webhook, resolve


class NotifyObserver:
    """Observes transitions and judgements, and sends what needs a person."""

    def __init__(self, config: RunConfig, book: Logbook, notifier: Optional[Notifier] = None) -> None:
        """``notifier``: where to send (default: the config's webhooks, read now: a missing
        secret is a NotifyConfigError before the run starts)."""
        self.config = config
        self.book = book
        self.notifier = notifier or Notifier(resolve(config.notify), config.notify, self._record)

    def on_transition(self, old: State | None, new: State) -> None:
        if isinstance(new, AwaitingApproval):
            decision = new.judgement.decision
            self._send("recommendation", new.subrun,
                       f"waiting for a person: runmgr would {decision.action} for the {new.judgement.incident.summary()}"
                       f"; `runmgr approve {self.config.run.name}` carries it out, `runmgr decline "
                       f"{self.config.run.name}` goes on without it", new.judgement)
        elif isinstance(new, Failed):
            self._send("needs_person", new.subrun, new.reason, details={"last_step": new.last_step})

    def on_poll(self, state, poll) -> None:
        """Nothing: a poll's steps are no one's business."""

    def on_judgement(self, state, judgement: Judgement) -> None:
        if self.config.notify.every_incident:
            self._send("incident", state.subrun, f"{judgement.incident.summary()} -> {judgement.decision.action}",
                       judgement)

    def on_recommendation(self, subrun: str, judgement: Judgement, text: str) -> None:
        """A shadow run's recommendation (runmgr/shadow/follower.py), if its kind is chosen."""
        kinds = self.config.notify.shadow_kinds
        if "all" in kinds or str(judgement.incident.kind) in kinds:
            self._send("recommendation", subrun, text, judgement)

    def close(self, wait_s: float = 30.0) -> None:
        self.notifier.close(wait_s)

    def _send(self, kind, subrun: str, summary: str, judgement: Optional[Judgement] = None,
              details: Optional[dict] = None) -> None:
        self.notifier.send(Notification(
            kind=kind, run=self.config.run.name, subrun=subrun, summary=summary, time=time.time(),
            incident=judgement.incident.to_dict() if judgement else None,
            decision=judgement.decision.to_dict() if judgement else None, details=details or {}))

    def _record(self, notification: Notification, hook: Webhook, error: Optional[str], attempts: int) -> None:
        """The delivery's outcome in the logbook, named by the webhook's label (never its URL)."""
        data = {"webhook": hook.label, "kind": notification.kind, "attempts": attempts}
        if error is None:
            self.book.record_event(notification.subrun, "notified",
                                   f"{hook.label} told: {notification.text()}", data)
        else:
            self.book.record_event(notification.subrun, "notification_failed",
                                   f"{hook.label} not told after {attempts} tries ({error}): {notification.text()}",
                                   {**data, "error": error})
