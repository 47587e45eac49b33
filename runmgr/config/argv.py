"""Reading and rewriting a Megatron-style argument list (``--flag value ...``).

Megatron-LM's parser is argparse with ``allow_abbrev=False``: a flag is only
its full name, written ``--name value [value ...]``, ``--name=value`` or, for a
switch, ``--name`` alone. A token is a value until the next flag; a negative
number (``-1``) is a value, as argparse reads it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

_FLAG = re.compile(r"--[A-Za-z][\w-]*")


def is_flag(token: str) -> bool:
    """True for ``--name`` and ``--name=value``."""
    return _FLAG.match(token) is not None


def _name(token: str) -> str:
    return token.partition("=")[0]


def occurrences(args: Sequence[str], name: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` index spans of every occurrence of flag ``name`` with its values."""
    spans, index = [], 0
    while index < len(args):
        token = args[index]
        end = index + 1
        if is_flag(token):
            while end < len(args) and not is_flag(args[end]) and "=" not in token:
                end += 1
            if _name(token) == name:
                spans.append((index, end))
        index = end
    return spans


def flag_values(args: Sequence[str], name: str) -> Optional[list[str]]:
    """The values of the last occurrence of ``name`` (argparse keeps the last); None when absent."""
    spans = occurrences(args, name)
    if not spans:
        return None
    start, end = spans[-1]
    token = args[start]
    if "=" in token:
        return [token.partition("=")[2]]
    return list(args[start + 1:end])


def flag_value(args: Sequence[str], name: str) -> Optional[str]:
    """The single value of ``name``; None when absent or given without a value."""
    values = flag_values(args, name)
    return values[0] if values else None


def has_flag(args: Sequence[str], name: str) -> bool:
    return bool(occurrences(args, name))


def flag_names(args: Sequence[str]) -> list[str]:
    """Every flag named in ``args``, in order (repeats kept)."""
    return [_name(token) for token in args if is_flag(token)]


def without_flags(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """``args`` with every occurrence of the ``names`` flags (and their values) removed."""
    drop: set[int] = set()
    for name in names:
        for start, end in occurrences(args, name):
            drop.update(range(start, end))
    return [token for index, token in enumerate(args) if index not in drop]
