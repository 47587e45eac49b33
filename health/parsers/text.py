"""Small text helpers shared by the parsers of ``key : value`` tool output."""

from __future__ import annotations

from typing import Optional

NOT_AVAILABLE = {"n/a", "[n/a]", "na", "-", "[not supported]", "not supported", ""}


def split_key_value(line: str) -> Optional[tuple[str, str]]:
    """``"  HBM Double Bit Error Count   : 0"`` -> ``("HBM Double Bit Error Count", "0")``.

    Splits on the first ``" : "``-like colon (a colon followed by space or end),
    so that values such as bus ids (``0000:C1:00.0``) keep their colons.
    """
    for i, ch in enumerate(line):
        if ch == ":" and (i + 1 == len(line) or line[i + 1] in " \t"):
            key = line[:i].strip()
            if key:
                return key, line[i + 1:].strip()
            return None
    return None


def to_int(value: Optional[str]) -> Optional[int]:
    """An integer count, or None for N/A-like values and garbage."""
    if value is None or value.strip().lower() in NOT_AVAILABLE:
        return None
    token = value.strip().split()[0]
    try:
        return int(token, 0) if token.lower().startswith("0x") else int(token)
    except ValueError:
        return None


def to_float(value: Optional[str]) -> Optional[float]:
    """A number (units after a space are dropped), or None for N/A-like values."""
    if value is None or value.strip().lower() in NOT_AVAILABLE:
        return None
    try:
        return float(value.strip().split()[0])
    except ValueError:
        return None


def to_bool(value: Optional[str]) -> Optional[bool]:
    """Yes/No, True/False, Enabled/Disabled -> bool; anything else -> None."""
    if value is None:
        return None
    word = value.strip().lower()
    if word in ("yes", "true", "enabled", "active"):
        return True
    if word in ("no", "false", "disabled", "not active"):
        return False
    return None
