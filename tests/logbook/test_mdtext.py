"""Markdown pieces: a run's string rendered by a CommonMark viewer (with GFM
tables and strikethrough) reads back as the very string, never as markup."""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from logbook import mdtext as md

VIEWER = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def shown(markdown: str) -> str:
    """What a reader sees of one paragraph (entities decoded back to characters)."""
    tokens = VIEWER.parse(markdown)
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], markdown
    return "".join(child.content for child in tokens[1].children if child.type in ("text", "code_inline"))


@pytest.mark.parametrize("raw", [
    "| <script>alert(1)</script> # x", "# heading", "1. item", "- item", "+ item", "> quote", "===",
    "*bold* _em_ ~~gone~~ `code`", "[link](http://example.com) ![img](x.png) [ref] [^1]", "a [1, 2) b](http://x)", "<img src=x onerror=alert(1)>",
    r"back\slash \* kept", "$x^2$ & &amp; entity", "loss_spike at step_00000020",
])
def test_text_reads_back_as_itself(raw):
    assert shown(md.text(raw)) == raw


def test_text_keeps_a_multiline_message_on_one_line():
    assert md.text("Traceback:\n  File x\n# not a heading") == "Traceback: File x # not a heading"


def test_code_spans_only_what_they_can_carry():
    assert md.code("checkpoints/step_00000020") == "`checkpoints/step_00000020`"
    assert shown(md.code("a`b|c")) == "a`b|c"


def test_a_table_cell_with_a_pipe_stays_one_cell():
    lines = md.table(("key", "value"), [(md.text("a | b"), md.text("<c>"))])
    rows = [["".join(c.content for c in cell.children) for cell in tr] for tr in _rows(VIEWER.parse("\n".join(lines)))]
    assert rows == [["key", "value"], ["a | b", "<c>"]]


def test_a_fence_is_longer_than_any_backticks_inside():
    lines = md.fenced(["echo ```", "````"], "sh")
    tokens = VIEWER.parse("\n".join(lines))
    assert [t.type for t in tokens] == ["fence"] and tokens[0].content == "echo ```\n````\n"


def _rows(tokens):
    row = None
    for token in tokens:
        if token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token)
        elif token.type == "tr_close":
            yield row
            row = None


def test_what_cannot_make_markup_is_left_readable():
    assert md.text("OSError: [Errno 30] Read-only -> loss_spike at step_00000100") == (
        "OSError: [Errno 30] Read-only -> loss_spike at step_00000100")
