"""Closed sets of strings (decision actions, incident kinds, death categories).

Each member's name is its value, so YAML, JSON, OmegaConf (which reads an
enum by name) and plain string comparisons all see the same word.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A string from a closed set; prints and serialises as the plain value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Every value, in declaration order."""
        return tuple(member.value for member in cls)
