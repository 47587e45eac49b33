"""The suite's CPU profiler (tests/cpu_profile.py) counts what a test's processes spend, the
ones that escape the test's own accounting included: a grandchild that the test never waits
for (as Ray's workers are the raylet's, not the test's) is counted to the test that started it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpu_profile import V1_ROOT, V2_ROOT, summary

ROOT = Path(__file__).resolve().parents[1]
BURN_S = 1.0

PROFILED = f"""
import os, subprocess, sys, time

DONE = os.path.join(os.path.dirname(__file__), "burned")
BURN = f"import time\\nwhile time.process_time() < {BURN_S}: pass\\nopen({{DONE!r}}, 'w').close()"


def test_idle():
    time.sleep(0.2)


def test_a_detached_grandchild_burns():
    # A child that starts a grandchild in a session of its own and exits at once: the grandchild is
    # reparented to init, and no wait of this test's ever reaps it.
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    + repr(BURN) + "], start_new_session=True)"], check=True)
    while not os.path.exists(DONE):  # the grandchild burns its CPU-second while this test lasts, however
        time.sleep(0.05)            # long a loaded machine takes to give it one
"""


def cgroups_writable() -> bool:
    return os.geteuid() == 0 and (V1_ROOT.is_dir() or (V2_ROOT / "cgroup.controllers").exists())


@pytest.mark.skipif(not cgroups_writable(), reason="needs a writable cgroup hierarchy (root)")
def test_a_test_s_cpu_counts_the_processes_it_started_that_no_one_waited_for(tmp_path):
    (tmp_path / "test_profiled.py").write_text(PROFILED)
    output = tmp_path / "cpu.jsonl"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_profile",
                             "-p", "no:xdist", str(tmp_path / "test_profiled.py")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CPU_PROFILE": str(output), "PYTEST_ADDOPTS": "",
                                 "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = {line["id"].split("::")[1]: line for line in map(json.loads, output.read_text().splitlines())}
    assert lines["test_idle"]["cpu"] < 0.5 * BURN_S
    assert lines["test_a_detached_grandchild_burns"]["cpu"] >= BURN_S
    table = summary(list(lines.values())).splitlines()
    cpu_s, _, tests, module = table[1].split()
    assert module.endswith("test_profiled.py") and tests == "2" and float(cpu_s) >= BURN_S


def test_without_a_file_to_write_to_the_profiler_refuses_in_one_line(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.cpu_profile", "-p", "no:xdist",
                             str(tmp_path / "test_nothing.py")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in {**os.environ, "PYTEST_ADDOPTS": "", "PYTHONPATH": str(ROOT)}.items()
                                 if k != "CPU_PROFILE"})
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage error
    assert "set CPU_PROFILE=FILE" in result.stderr
