"""Shared helpers for the health tests: fixture texts and scripted vendor tools."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def read_fixture(relative: str) -> str:
    return (FIXTURES / relative).read_text()


@pytest.fixture
def fixture_text() -> Callable[[str], str]:
    """``fixture_text("npu_smi/info_910b_ok.txt")`` -> the stored real-format text."""
    return read_fixture


@pytest.fixture
def tool_dir(tmp_path: Path) -> Path:
    """An empty directory to hold scripted tools; pass ``str(tool_dir)`` as PATH."""
    directory = tmp_path / "bin"
    directory.mkdir()
    return directory


def write_tool(directory: Path, name: str, cases: list[tuple[str, str]]) -> Path:
    """A shell script ``name`` that answers by its arguments: each case is a
    shell glob over ``"$*"`` and the shell commands to run for it. Arguments
    no case matches exit 2, as a real tool does on bad usage."""
    branches = "\n".join(f'  {pattern}) {body} ;;' for pattern, body in cases)
    script = directory / name
    script.write_text(
        "#!/bin/sh\nPATH=/usr/bin:/bin\n"
        f'case "$*" in\n{branches}\n  *) echo "{name}: bad arguments: $*" >&2; exit 2 ;;\nesac\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def cat_body(relative: str) -> str:
    """Shell body printing a stored fixture."""
    return f"cat '{FIXTURES / relative}'"


@pytest.fixture
def cat() -> Callable[[str], str]:
    """``cat("xid/dmesg_faults.txt")`` -> a tool body that prints that fixture."""
    return cat_body


@pytest.fixture
def scripted_tools(tool_dir: Path):
    """``scripted_tools(name, cases)`` writes a tool into ``tool_dir``."""
    return lambda name, cases: write_tool(tool_dir, name, cases)


def running_as_root() -> bool:
    return os.geteuid() == 0
