"""Fixtures shared by the worker tests."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture
def child():
    """A live process of this machine, as a driver (a test kills it to make the driver gone)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()
