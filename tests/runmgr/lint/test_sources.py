"""Issue 32: the lint's ``source:`` lines and the commands' help said "seed 000", "seed 004" and
"OPT Run 11/12 lessons", words a user cannot look up. Every source a rule names is now one of
the lessons docs/lint.md describes, and no help text speaks of seeds."""

from __future__ import annotations

import argparse
import io
import re
from contextlib import redirect_stdout
from pathlib import Path

from runmgr.cli import build_parser
from runmgr.config.lint import REMEDIES, RULE_TABLE

ROOT = Path(__file__).resolve().parents[3]


def described_sources() -> str:
    text = (ROOT / "docs" / "lint.md").read_text()
    return text.split("## Where the lessons come from", 1)[1].split("\n## ", 1)[0]


def test_every_rule_names_a_source_that_docs_lint_describes():
    described = described_sources()
    for entry in RULE_TABLE:
        for source in entry.source.split("; "):
            if source == REMEDIES:  # runmgr's own: docs/megatron.md
                continue
            named = source.split(":")[0]  # "case report 000", or "OPT-175B's logbook, Runs 11-12"
            assert f"**{named}**" in described, (entry.id, source)


def every_help(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.format_help()]
    for action in parser._actions:  # argparse keeps its sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            texts += [text for child in action.choices.values() for text in every_help(child)]
    return texts


def test_no_help_text_speaks_of_seeds():
    texts = every_help(build_parser())
    assert len(texts) > 10  # every command and sub-command was reached
    for text in texts:
        assert not re.search(r"\bseeds? 00\d", text), text


def test_the_lint_prints_a_source_in_words():
    from runmgr.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        main(["lint", "conf=demo", "optim.adam_beta2=0.999", "--config-dir", str(ROOT / "conf")])
    text = out.getvalue()
    assert "source:  case report 000: LLaMA2-70B on an Ascend NPU cluster; OPT-175B's logbook, Runs 11-12" in text
    assert "seed 0" not in text
