"""Notifications sent in the background: each one POSTed as JSON to every webhook, retried with a
doubling wait, never blocking the run. What was sent, and what could not be, is told back (the
logbook records both); a URL is never part of what is told."""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Callable, Literal, Optional, Sequence

from runmgr.choices import NotifyFormat
from runmgr.config.notify import NotifyConfig
from runmgr.notify.targets import Webhook

NotificationKind = Literal["needs_person", "recommendation", "incident"]
HEADLINES = {"needs_person": "needs a person", "recommendation": "recommends (not acted on)",
             "incident": "incident"}


@dataclass(frozen=True)
class Notification:
    """What a person is told: one event of one run."""

    kind: NotificationKind
    run: str
    subrun: str
    summary: str
    """One line: the incident, the decision or why the run stopped."""
    time: float
    incident: Optional[dict] = None
    decision: Optional[dict] = None
    details: dict = field(default_factory=dict)
    about_seq: Optional[int] = None
    """The logbook entry it tells of (a shadow run's recommendation): its delivery is recorded
    with it, so a follower restarted before the delivery sends what was never told."""

    def text(self) -> str:
        return f"runmgr: run {self.run} ({self.subrun}) {HEADLINES[self.kind]}: {self.summary}"

    def key(self) -> str:
        """The same for every sending of one event: a recommendation's names its logbook entry, so a
        resend after a follower's restart carries the key of the first sending."""
        if self.about_seq is not None:
            return f"{self.run}/entry-{self.about_seq}"
        return f"{self.run}/{self.subrun}/{self.kind}/{self.time:.6f}"

    def payload(self, style: str) -> dict:
        """``generic``: the whole event as data, with its ``text`` and its ``id`` (:meth:`key`: a
        receiver that deduplicates by it, as a pager's dedup key does, shows an event sent twice
        once); ``slack``: ``{"text": ...}``."""
        if style == NotifyFormat.slack:
            return {"text": self.text()}
        told = asdict(self)
        del told["about_seq"]  # the logbook's bookkeeping, not the person's
        return {"id": self.key(), "text": self.text(), **told}


Outcome = Callable[[Notification, Webhook, Optional[str], int], None]
"""Told once per notification and webhook: the error (None: delivered) and the tries it took."""


def post(url: str, body: bytes, timeout_s: float) -> None:
    """One JSON POST; raises on anything but a 2xx answer."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "runmgr"})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 (the user's own webhook)
        answer.read()


def _reason(problem: Exception) -> str:
    """What went wrong, in words that hold no URL."""
    if isinstance(problem, urllib.error.HTTPError):
        return f"HTTP {problem.code} {problem.reason}"
    if isinstance(problem, urllib.error.URLError):
        return f"no answer ({problem.reason})"
    return f"{type(problem).__name__}: {problem}"


class Notifier:
    """Sends notifications from a thread of its own; :meth:`send` only queues."""

    def __init__(self, webhooks: Sequence[Webhook], config: NotifyConfig, outcome: Outcome,
                 send_one: Callable[[str, bytes, float], None] = post) -> None:
        self.webhooks = list(webhooks)
        self.config = config
        self.outcome = outcome
        self.send_one = send_one
        self._queue: queue.Queue[Optional[Notification]] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runmgr-notify", daemon=True)
        self._thread.start()

    def send(self, notification: Notification) -> None:
        if self.webhooks:
            self._queue.put(notification)

    def close(self, wait_s: float = 30.0) -> None:
        """Send what is queued, for at most ``wait_s`` more (a run that ends still tells its
        person why); a retry's wait is cut short once closing."""
        self._queue.put(None)
        self._thread.join(timeout=wait_s)
        self._closing.set()
        self._thread.join(timeout=self.config.timeout_s + 1.0)

    def _run(self) -> None:
        while True:
            notification = self._queue.get()
            if notification is None:
                return
            for hook in self.webhooks:
                self._deliver(notification, hook)

    def _deliver(self, notification: Notification, hook: Webhook) -> None:
        body = json.dumps(notification.payload(self.config.format), default=str).encode()
        wait, error = self.config.backoff_s, None
        for attempt in range(1, self.config.attempts + 1):
            try:
                self.send_one(hook.url, body, self.config.timeout_s)
            except (OSError, ValueError) as problem:  # urllib's errors are OSErrors; a bad answer too
                error = _reason(problem)
                if attempt < self.config.attempts and not self._closing.wait(wait):
                    wait *= 2
                    continue
                break
            else:
                self.outcome(notification, hook, None, attempt)
                return
        self.outcome(notification, hook, error, attempt)
