"""A Ray cluster held by a helper script in a process of its own (a pytest worker may
hold another Ray connection): the script prints one JSON line describing it, then
holds it until its stdin closes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def cluster_process(script: Path, *args: str) -> Iterator[dict]:
    """Run ``script ARGS``; yield the description it prints; shut it down at the end."""
    helper = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = helper.stdout.readline()
        assert line, f"the cluster did not start (exit {helper.wait(timeout=60)})"
        yield json.loads(line)
    finally:
        helper.stdin.close()  # the helper shuts the cluster down
        try:
            helper.wait(timeout=60)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
