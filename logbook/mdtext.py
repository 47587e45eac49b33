"""Markdown pieces that keep a run's text as text: whatever a run recorded
(a loss message, a node name, a config value, a path) is escaped before it
goes into a document, so it never turns into a heading, a table column, a
link, emphasis or HTML. Pure functions over strings."""

from __future__ import annotations

import re
from typing import Sequence

_SPECIAL = re.compile(r"[\\`*<|~$&]|\](?=[(\[])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
"""Characters that can make markup inside a line (CommonMark lets any ASCII
punctuation be backslash-escaped; these are the ones that mean something
inline, in GFM tables, in strikethrough and in math). Some stay as they are,
for a text that reads well as plain Markdown too: ``[`` and a ``]`` not
followed by ``(`` or ``[`` (a link or image needs ``](`` or ``][``; the other
forms need a definition, which only starts a line), ``>`` (HTML opens with ``<``;
a quote only starts a line) and an underscore inside a word (``loss_spike``
makes no emphasis)."""
_LINE_START = re.compile(r"^(\d{0,9})([-+=#.)>])(?=[\s=#>]|$)")
"""What makes a list, a heading, a quote or a setext underline when it starts
a line (``- x``, ``1. x``, ``# x``, ``> x``): the mark is escaped, the digits before it stay."""
_WHITESPACE = re.compile(r"\s+")


def text(value: object) -> str:
    """A run's string as one line of literal Markdown text.

    Line breaks become spaces (a recorded message may hold a traceback; a new
    line in a list item or a table cell would end it)."""
    flat = _WHITESPACE.sub(" ", str(value)).strip()
    return _LINE_START.sub(r"\1\\\2", _SPECIAL.sub(lambda m: "\\" + m.group(0), flat), count=1)


def code(value: object) -> str:
    """A path or an identifier as inline code, or as escaped text when it holds
    what a code span cannot carry (a backtick, a pipe that would split a table
    cell, a line break)."""
    raw = str(value)
    if not raw or any(ch in raw for ch in "`|\n\r"):
        return text(raw)
    return f"`{raw}`"


def fenced(lines: Sequence[str], info: str = "") -> list[str]:
    """A fenced code block whose fence is longer than any run of backticks
    inside, so no line of the content can close it."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *lines, fence]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A GFM table; cells must already be Markdown (escaped with :func:`text`).

    ``align`` holds one letter per column, ``l`` or ``r`` (default left)."""
    marks = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(header))]
    return [_row(header), _row(marks), *(_row(row) for row in rows)]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
