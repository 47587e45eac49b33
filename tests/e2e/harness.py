"""Helpers for end-to-end runs: a real `runmgr launch` in a subprocess (its
own local Ray, real worker processes over gloo), driven like a user would.

A test reaches a moment of a run through the run's own state, never by racing
it: ``pause_after(N)`` makes every rank finish step N and wait (chaos
``pause_at_step``), :meth:`LaunchedRun.wait_paused` waits until the run stands
still there, the test acts, and :meth:`LaunchedRun.release` lets it go on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from tests import cli

ROOT = Path(__file__).resolve().parents[2]

# Small enough for CI on 2 cores, long enough to be killed in the middle.
E2E_OVERRIDES = [
    "chaos=none", "watcher=default", "policy=default", "cluster.local_nodes=1", "health.skip=true",
    "training.train_iters=40", "checkpoint.save_interval=10", "checkpoint.keep_last=3",
    "model.num_layers=1", "model.hidden_size=64", "model.ffn_hidden_size=172",
    "model.seq_length=64", "model.max_position_embeddings=64",
    "training.micro_batch_size=2", "training.global_batch_size=8", "data.corpus_max_bytes=400000",
]

CRASH_DUMP_MARKS = ("Traceback", "received at time=", "PC: @", "*** SIG", "\x1b[")
"""What a crash prints: Python's traceback, the native failure handler's dump (absl: '*** SIGTERM
received at time=...', 'PC: @ 0x...'), and Ray's coloured log lines. A requested stop prints none."""


def pause_label(step: int, index: int = 0) -> str:
    """The schedule label of the pause :func:`pause_after` adds (the only fault of its schedule),
    or of the ``index``-th of :func:`pauses_after`."""
    return f"{index}:pause_at_step@{step}"


def pause_after(step: int) -> str:
    """The override that makes every rank finish ``step``, then wait for its release."""
    return pauses_after(step)


def pauses_after(*steps: int) -> str:
    """The override of several pauses, in order: the ``index``-th is :func:`pause_label` (step, index)."""
    return "chaos.faults=[" + ", ".join(f"{{kind: pause_at_step, at_step: {step}}}" for step in steps) + "]"


class LaunchedRun:
    """A `runmgr launch` subprocess and the run directory it writes."""

    def __init__(self, run_dir: Path, extra: list[str] | None = None, base: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``base`` replaces the small e2e config (E2E_OVERRIDES); ``env`` the driver's environment."""
        self.run_dir = run_dir
        self.env = env
        self.args = [sys.executable, "-m", "runmgr", "launch", "conf=demo", f"run.dir={run_dir}",
                     f"run.name={run_dir.name}", *(E2E_OVERRIDES if base is None else base), *(extra or [])]
        self.log = run_dir.parent / f"{run_dir.name}.driver.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "LaunchedRun":
        """The driver, in a session of its own; forked from the CLI fork server when the
        command is a plain ``python -m runmgr`` (tests/cli.py), a new process otherwise."""
        runmgr_args = self.args[3:] if self.args[:3] == [sys.executable, "-m", "runmgr"] else None
        if runmgr_args is not None:
            self.proc = cli.start_runmgr(runmgr_args, ROOT, self.env, self.log)
            return self
        with open(self.log, "a") as log_file:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=self.env)
        return self

    def wait(self, timeout: float = 300) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text()

    def status(self) -> dict | None:
        path = self.run_dir / "status.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_for(self, predicate, timeout: float = 180, what: str = "condition") -> dict:
        """Poll the status file until predicate(status) holds; fail with the log otherwise."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status()
            if status and predicate(status):
                return status
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail(f"driver exited ({self.proc.returncode}) before {what}:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}:\n{self.output()[-3000:]}")

    def wait_paused(self, step: int, timeout: float = 300, index: int = 0) -> dict:
        """Wait until every rank has finished ``step`` and waits (status.json) and the
        lineage has recorded the pause (chaos_state.json), so that no later sub-run or
        relaunch pauses again; the status then."""
        label = pause_label(step, index)
        status = self.wait_for(lambda s: s["state"] == "running" and bool(s["workers"])
                               and s.get("paused_ranks") == sorted(w["rank"] for w in s["workers"])
                               and ChaosState(self.run_dir).has_fired(label),
                               timeout=timeout, what=f"every rank paused after step {step}")
        assert status["step"] == step, status
        return status

    def release(self, step: int, index: int = 0) -> None:
        """Let the ranks paused after ``step`` go on."""
        release_file(self.run_dir, pause_label(step, index)).touch()

    def kill_driver(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def runmgr_traceback(output: str) -> bool:
    """Whether runmgr (or a process it started, on its console) printed a Python traceback.
    The job's own lines quoted under an incident (``    | ...``) are the job's words, not
    runmgr's: torchrun's agent prints a traceback when its peer's store is gone at the exit
    barrier, and whether that lands among a node's last lines depends on the machine's load."""
    return any(line.startswith("Traceback (most recent call last)") for line in output.splitlines())


def runmgr_json_lines(*args: str) -> list[dict]:
    out = cli.runmgr(*args, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def runmgr_text(*args: str) -> str:
    out = cli.runmgr(*args, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def kept_losses(run_dir: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in runmgr_json_lines("logbook", "metrics", str(run_dir), "--json")}


def pid_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
