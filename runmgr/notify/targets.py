"""The webhooks a run's config names, read where they are kept (the environment, a file) when the
run starts, so that a missing secret is one line before anything runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from runmgr.config.notify import ENV_PREFIX, FILE_PREFIX, MASK, SCHEMES, NotifyConfig
from runmgr.errors import UserError


class NotifyConfigError(UserError):
    """A webhook whose URL cannot be read: one line, how to fix it."""


@dataclass(frozen=True)
class Webhook:
    """A webhook: its URL (a secret) and how the logbook and the log may name it."""

    url: str
    label: str
    """``webhook 1 (env:NAME)``: never the URL."""

    def __repr__(self) -> str:  # a traceback or a debug print shows no secret
        return f"Webhook({self.label})"


def resolve(config: NotifyConfig, environ: Mapping[str, str] = os.environ) -> list[Webhook]:
    """Every webhook's URL, read now; NotifyConfigError naming the one that cannot be."""
    hooks = []
    for number, target in enumerate(config.targets(), start=1):
        named = target if target.startswith((ENV_PREFIX, FILE_PREFIX)) else MASK
        label = f"webhook {number} ({named})"
        hooks.append(Webhook(_url(target, label, environ), label))
    return hooks


def _url(target: str, label: str, environ: Mapping[str, str]) -> str:
    if target.startswith(ENV_PREFIX):
        name = target[len(ENV_PREFIX):]
        url = environ.get(name, "").strip()
        if not url:
            raise NotifyConfigError(f"{label}: the environment variable {name} is not set; export it with the "
                                    f"webhook's URL, or name another with notify.webhook=env:NAME")
    elif target.startswith(FILE_PREFIX):
        path = Path(target[len(FILE_PREFIX):])
        try:
            url = path.read_text().strip()
        except OSError as problem:
            raise NotifyConfigError(f"{label}: cannot read {path} ({problem.strerror or problem}); "
                                    f"write the webhook's URL in it, or name another file") from None
    else:
        url = target
    if not url.startswith(SCHEMES):
        raise NotifyConfigError(f"{label}: what it holds is not an http(s) URL; put the webhook's URL there")
    return url
