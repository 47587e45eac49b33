"""Who is told when a run needs a person: webhooks (``notify.webhook``, ``notify.webhooks``), what
they are told, and how hard runmgr tries (runmgr/notify/; docs/notify.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from runmgr.choices import NotifyFormat

ENV_PREFIX, FILE_PREFIX = "env:", "file:"
SCHEMES = ("http://", "https://")
MASK = "(set: not recorded)"
"""What the logbook's copy of the config holds in place of a webhook written out in it."""


def webhook_problem(key: str, value: str) -> Optional[str]:
    """Why ``value`` cannot name a webhook (None when it can): ``env:NAME``, ``file:PATH`` or an
    http(s) URL. Nothing here reads the environment or the file: that is the sender's start."""
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX):]
        if not name or not (name.replace("_", "").isalnum() and not name[0].isdigit()):
            return f"{key} {value!r}: env: needs an environment variable's name, e.g. env:RUNMGR_SLACK_WEBHOOK"
        return None
    if value.startswith(FILE_PREFIX):
        return None if value[len(FILE_PREFIX):] else f"{key} 'file:': name the file holding the URL, e.g. file:/run/secrets/webhook"
    if not value.startswith(SCHEMES):
        return (f"{key}: expected an http(s) URL, env:NAME (the URL in that environment variable) or file:PATH "
                f"(the URL in that file), got a value starting {value[:8]!r}")
    return None


@dataclass
class NotifyConfig:
    """Webhooks told of what needs a person. A URL is a secret (a Slack webhook's URL is its
    credential): prefer ``env:NAME`` or ``file:PATH``; a URL written out in the config is used but
    never recorded (the logbook's copy of the config masks it, the log and ``status`` never show it)."""

    webhook: Optional[str] = None
    """One webhook: an http(s) URL, ``env:NAME`` (the URL in that environment variable) or
    ``file:PATH`` (the URL in that file, e.g. a Kubernetes secret's mount). None: no webhook."""
    webhooks: list[str] = field(default_factory=list)
    """More webhooks, each as ``webhook``; each gets every notification."""
    format: NotifyFormat = NotifyFormat.generic
    """``generic``: a JSON object with the run, sub-run, event, incident and decision as data and a
    ``text`` line; ``slack``: only ``{"text": ...}``, what a Slack-compatible incoming webhook takes."""
    every_incident: bool = False
    """Also every incident, the ones runmgr handles by itself included (default: only what needs a
    person: a run that stopped for one, a recommendation in shadow mode)."""
    shadow_kinds: list[str] = field(default_factory=lambda: ["all"])
    """In shadow mode (``runmgr watch follow``), the incident kinds whose recommendations are sent
    (``loss_spike``, ``hang``, ...; ``all``: every kind)."""
    attempts: int = 5
    """Tries per notification and webhook before its failure is a logbook event."""
    backoff_s: float = 1.0
    """Wait before the second try; doubled before each next one."""
    timeout_s: float = 10.0
    """Seconds one POST may take."""

    def targets(self) -> list[str]:
        """Every webhook named, in order (``webhook`` first)."""
        return ([self.webhook] if self.webhook else []) + list(self.webhooks)

    def problems(self) -> list[str]:
        out = [problem for key, value in self._named() if (problem := webhook_problem(key, value))]
        if self.attempts < 1:
            out.append(f"notify.attempts must be at least 1, got {self.attempts}")
        if self.backoff_s < 0 or self.timeout_s <= 0:
            out.append("notify.backoff_s must be >= 0 and notify.timeout_s > 0")
        return out

    def _named(self) -> list[tuple[str, str]]:
        single = [("notify.webhook", self.webhook)] if self.webhook else []
        return single + [(f"notify.webhooks[{i}]", value) for i, value in enumerate(self.webhooks)]

    def masked(self) -> dict:
        """This section as the logbook records it: references (``env:``, ``file:``) as they are, URLs masked."""
        hide = lambda value: value if value.startswith((ENV_PREFIX, FILE_PREFIX)) else MASK  # noqa: E731
        return {"webhook": hide(self.webhook) if self.webhook else None,
                "webhooks": [hide(value) for value in self.webhooks]}
