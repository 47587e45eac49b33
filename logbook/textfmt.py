"""Small text helpers for the chronicle: clock times, durations, wrapping,
and tidying machine text (absolute paths, long node ids) for a person."""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from typing import Any, Callable, Iterable, Optional, Sequence

_LONG_HEX = re.compile(r"\b[0-9a-f]{24,}\b")
"""Ray node ids (56 hex digits) and other hashes: 8 digits identify them on screen."""
SHORT_ID = 8


def clock_text(timestamp: float, with_date: bool = False) -> str:
    """Local wall-clock time, with the date when asked."""
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(timestamp))


def day(timestamp: float) -> str:
    """The local date of ``timestamp``, to notice when a chronicle crosses midnight."""
    return time.strftime("%Y-%m-%d", time.localtime(timestamp))


def duration(seconds: Optional[float]) -> str:
    """``3.5 s``, ``4m 12s``, ``2h 03m``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def value_text(value: Any, limit: int = 60) -> str:
    """A config or plan value as a person reads it, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def listing(word: str, items: Sequence[Any]) -> str:
    """``rank 1`` / ``ranks 0, 1``; empty when there are none."""
    if not items:
        return ""
    return f"{word}{'s' if len(items) > 1 else ''} {', '.join(str(i) for i in items)}"


def wrap(line: str, width: int, indent: str, max_lines: Optional[int] = None) -> list[str]:
    """Wrap a long line with a hanging indent; short lines are left alone.

    With ``max_lines`` the rest is cut and marked ``…`` (``runmgr logbook show
    --full`` prints it whole, ``runmgr logbook events`` with its evidence).
    """
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False,
                         max_lines=max_lines, placeholder=" …")


def pack(fields: Sequence[str], width: int, indent: str, separator: str = "   ") -> list[str]:
    """Lay unbreakable fields side by side, starting a new line when one would overflow."""
    lines: list[str] = []
    current = ""
    for field in fields:
        candidate = f"{current}{separator}{field}" if current else indent + field
        if current and len(candidate) > width:
            lines.append(current)
            candidate = indent + field
        current = candidate
    return lines + ([current] if current else [])


def phrases(head: str, items: Sequence[str], width: int, indent: str, hang: str, separator: str = ";") -> list[str]:
    """``head`` then ``items`` joined by ``separator``, broken between items
    where possible (an item longer than a line is wrapped on its own)."""
    pieces = [item + (separator if position < len(items) - 1 else "") for position, item in enumerate(items)]
    lines: list[str] = []
    current, fresh = indent + head, True
    for piece in pieces:
        candidate = current + piece if fresh else f"{current} {piece}"
        if not fresh and len(candidate) > width:
            lines.append(current)
            candidate = hang + piece
        current, fresh = candidate, False
    lines.append(current)
    return [part for line in lines for part in wrap(line, width, hang)]


def tidier(run_dirs: Iterable[Optional[str]]) -> Callable[[str], str]:
    """A function that makes machine text readable: paths under any of
    ``run_dirs`` become relative to it, long hex ids shrink to 8 digits.

    A run directory matches only where a path starts (not inside a longer
    path: ``runs/x/`` inside ``/home/me/runs/x/...``), in the form given and
    as an absolute path, so what is left is always a correct path relative
    to the run directory."""
    forms = set()
    for run_dir in run_dirs:
        if run_dir and str(run_dir).rstrip("/"):
            forms.add(str(run_dir).rstrip("/"))
            forms.add(os.path.abspath(str(run_dir)))
    roots = sorted(forms, key=len, reverse=True)
    patterns = [re.compile(rf"(?<![\w./~-]){re.escape(root)}/") for root in roots]

    def tidy(text: str) -> str:
        for pattern in patterns:
            text = pattern.sub("", text)
        return _LONG_HEX.sub(lambda m: m.group(0)[:SHORT_ID] + "…", text)

    return tidy
