"""What a job printed, made safe to show: its bytes reach a terminal and the logbook as text,
never as commands to them."""

from __future__ import annotations


def printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, its control characters (NUL, terminal escape
    sequences) written as ``\\xNN``; tabs kept."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text[:limit])
