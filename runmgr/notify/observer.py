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

    def on_recommendation(self, subrun: str, judgement: Judgement, text: str, about_seq: Optional[int] = None) -> None:
        """A shadow run's recommendation (runmgr/shadow/follower.py), if its kind is chosen;
        ``about_seq``: its logbook entry."""
        if self._chosen(str(judgement.incident.kind)):
            self._send("recommendation", subrun, text, judgement, about_seq=about_seq)

    def resend_untold(self, events: list[dict]) -> int:
        """A restarted follower's duty: the recommendations of ``events`` (the logbook's) whose
        delivery was never recorded (the follower was killed between recording and sending)
        sent now, from their entries; how many."""
        outcomes = [e for e in events if e.get("type") == "event" and e.get("kind") in ("notified", "notification_failed")]
        told = {e["data"].get("about_seq") for e in outcomes if e.get("data")}
        # A logbook written before deliveries named their entry: what came before its last
        # delivery was sent (one thread sends in order), and is not sent twice.
        unnamed = max((e["seq"] for e in outcomes if not (e.get("data") or {}).get("about_seq")), default=0)
        untold = [e for e in events if e.get("type") == "event" and e.get("kind") == "recommendation"
                  and e["seq"] not in told and e["seq"] > unnamed and self._chosen(str(e["data"].get("incident_kind")))]
        for entry in untold:
            data = entry["data"]
            self.notifier.send(Notification(
                kind="recommendation", run=self.config.run.name, subrun=entry["subrun"], summary=entry["message"],
                time=entry["time"], incident={"kind": data.get("incident_kind"), "onset_step": data.get("step")},
                decision={"action": data.get("action"), "reason": data.get("reason"),
                          "restart_from_step": data.get("restart_from_step")},
                details={"resent": "recorded before the follower's restart, never sent"}, about_seq=entry["seq"]))
        return len(untold)

    def _chosen(self, incident_kind: str) -> bool:
        kinds = self.config.notify.shadow_kinds
        return "all" in kinds or incident_kind in kinds

    def close(self, wait_s: float = 30.0) -> None:
        self.notifier.close(wait_s)

    def _send(self, kind, subrun: str, summary: str, judgement: Optional[Judgement] = None,
              details: Optional[dict] = None, about_seq: Optional[int] = None) -> None:
        self.notifier.send(Notification(
            kind=kind, run=self.config.run.name, subrun=subrun, summary=summary, time=time.time(),
            incident=judgement.incident.to_dict() if judgement else None,
            decision=judgement.decision.to_dict() if judgement else None, details=details or {},
            about_seq=about_seq))

    def _record(self, notification: Notification, hook: Webhook, error: Optional[str], attempts: int) -> None:
        """The delivery's outcome in the logbook, named by the webhook's label (never its URL)."""
        data = {"webhook": hook.label, "kind": notification.kind, "attempts": attempts,
                **({"about_seq": notification.about_seq} if notification.about_seq is not None else {})}
        if error is None:
            self.book.record_event(notification.subrun, "notified",
                                   f"{hook.label} told: {notification.text()}", data)
        else:
            self.book.record_event(notification.subrun, "notification_failed",
                                   f"{hook.label} not told after {attempts} tries ({error}): {notification.text()}",
                                   {**data, "error": error})
