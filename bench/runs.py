"""What the benchmarks share: a `runmgr launch` subprocess driven like a user
would (status file, logbook), and the small statistics and table printing.

Not a test helper: failures raise :class:`BenchError` with the driver's log
tail instead of failing a pytest item.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]

# The demo model at a size every benchmark shares (conf/demo.yaml), without
# the demo's chaos schedule and spare nodes: each benchmark injects its own fault.
DEMO = "conf=demo"
DEMO_QUIET = ["chaos=none", "watcher=default", "policy=default", "cluster.local_nodes=1", "health.skip=true"]


class BenchError(RuntimeError):
    """A benchmark run did not get where it had to (the message says where)."""


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of every process a benchmark starts.

    RAY_ADDRESS=local: without it ``ray.init()`` joins whatever cluster
    /tmp/ray/ray_current_cluster names (another engineer's `ray start` or test
    cluster on this shared machine, possibly gone) instead of starting the
    run's own local Ray.
    """
    env = dict(os.environ)
    env["RAY_ADDRESS"] = "local"
    env.update(extra)
    return env


class Launch:
    """A driver subprocess (by default `runmgr launch conf=demo ...`) and its run directory.

    ``argv`` replaces `runmgr launch conf=demo` (a script that launches the demo in
    its own process); the quiet overrides, the run directory and ``overrides`` follow
    either way, so no benchmark runs the demo's chaos schedule by accident."""

    def __init__(self, run_dir: Path, overrides: Sequence[str], argv: Optional[list[str]] = None) -> None:
        self.run_dir = run_dir
        command = argv or [sys.executable, "-m", "runmgr", "launch", DEMO]
        self.args = [*command, *DEMO_QUIET, f"run.dir={run_dir}", f"run.name={run_dir.name}", *overrides]
        self.log_path = run_dir.parent / f"{run_dir.name}.driver.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Launch":
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env=bench_env(), start_new_session=True)
        return self

    def log_tail(self, chars: int = 2500) -> str:
        try:
            return self.log_path.read_text()[-chars:]
        except FileNotFoundError:
            return "(no driver log)"

    def status(self) -> Optional[dict]:
        try:
            return json.loads((self.run_dir / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
        """Poll status.json every 20 ms until ``predicate(status)`` holds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status()
            if status and predicate(status):
                return status
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"driver exited ({self.proc.returncode}) before {what}:\n{self.log_tail()}")
            time.sleep(0.02)
        raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log_tail()}")

    def worker_pid_at(self, step: int, rank: int, timeout: float = 300) -> tuple[int, int]:
        """Wait until the run has trained ``step`` steps; the pid of ``rank``'s worker
        then, and the step the run had reached (``step`` or a little more)."""
        status = self.wait_for(lambda s: s["state"] == "running" and s["step"] >= step and s["workers"],
                               timeout=timeout, what=f"step {step}")
        return next(w["pid"] for w in status["workers"] if w["rank"] == rank), status["step"]

    def wait(self, timeout: float = 300) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise BenchError(f"driver still running after {timeout:.0f} s:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """SIGTERM the driver we started (it stops its workers and its Ray), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def tree_cpu_seconds(root: int) -> dict[int, float]:
    """CPU seconds (user + system) that process ``root`` and every live process below it have
    used so far, by pid: a run's driver, its local Ray and its ranks (all descend from the driver)."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    below = {}
    for pid, seconds in used.items():
        ancestor = pid
        while ancestor not in (root, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            below[pid] = seconds
    return below


def logbook_rows(run_dir: Path, what: str, *flags: str) -> list[dict]:
    """``runmgr logbook {metrics|events} RUN_DIR --json [flags]`` as dicts."""
    out = subprocess.run([sys.executable, "-m", "runmgr", "logbook", what, str(run_dir), "--json", *flags],
                         cwd=ROOT, env=bench_env(), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise BenchError(f"runmgr logbook {what} {run_dir} failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain fixed-width table (floats with 3 decimals)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    sys.stdout.flush()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
