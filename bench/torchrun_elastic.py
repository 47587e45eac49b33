"""torchrun elastic on the benchmark's fault: the trainer alone (``python -m trainer conf=demo``,
which resumes from the newest verified checkpoint in ``checkpoint.save``) under
``torchrun --nproc_per_node=2 --max-restarts=3`` with a c10d rendezvous on 127.0.0.1 and
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (without it the new workers may dial the dead
worker's old store port and hang: ENVIRONMENT.md). Rank 0 prints a line per step; this
module timestamps each line as it arrives and finds rank 1's pid among torchrun's children."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from runs import ROOT, BenchError, bench_env

STEP_LINE = re.compile(r"^step\s+(\d+)")
RESUME_LINE = re.compile(r"resuming from \S+ \(step (\d+)\)")
START_LINE = re.compile(r"^start at step (\d+)")


class TimedLines:
    """Every stdout line of a process with the time it arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def snapshot(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self.lines)


def _rank_pid(launcher: int, rank: int) -> Optional[int]:
    """The pid of torchrun's worker with RANK=``rank`` (its environment says)."""
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(child)
    return None


def torchrun_trial(out_dir: Path, overrides: list[str], kill_step: int, victim: int) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    torchrun = Path(sys.executable).parent / "torchrun"
    argv = [str(torchrun), "--nproc_per_node=2", "--max-restarts=3", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "trainer", "conf=demo", "chaos=none",
            f"checkpoint.save={out_dir / 'checkpoints'}", *overrides]
    env = bench_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(out_dir / "torchrun.stderr", "w"),
                            text=True, env=env, start_new_session=True)
    lines = TimedLines(proc)
    try:
        reached = _wait_for_step(lines, proc, kill_step)
        pid = _rank_pid(proc.pid, victim)
        if pid is None:
            raise BenchError(f"torchrun in {out_dir}: no worker with RANK={victim}")
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    if code != 0:
        raise BenchError(f"torchrun in {out_dir} exited {code}: {(out_dir / 'torchrun.stderr').read_text()[-2000:]}")
    return _figures(lines.snapshot(), killed_at, reached)


def _wait_for_step(lines: TimedLines, proc: subprocess.Popen, step: int, timeout: float = 300) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        steps = [int(m.group(1)) for _, line in lines.snapshot() if (m := STEP_LINE.match(line))]
        if steps and steps[-1] >= step:
            return steps[-1]
        if proc.poll() is not None:
            raise BenchError(f"torchrun exited {proc.returncode} before step {step}")
        time.sleep(0.01)
    raise BenchError(f"torchrun did not reach step {step} in {timeout:.0f} s")


def _figures(lines: list[tuple[float, str]], killed_at: float, reached: int) -> dict:
    before = [int(m.group(1)) for at, line in lines if at < killed_at and (m := STEP_LINE.match(line))]
    after = [(at, line) for at, line in lines if at >= killed_at]
    resumed = next((int(m.group(1)) for _, line in after if (m := RESUME_LINE.search(line))), 0)
    start = next((at for at, line in after if START_LINE.match(line)), float("nan"))
    first = next((at for at, line in after if STEP_LINE.match(line)), float("nan"))
    return {"kill_step": reached, "last_step": max(before), "resumed_step": resumed, "detect_s": float("nan"),
            "workers_up_s": float("nan"), "ready_s": start - killed_at, "first_step_s": first - killed_at}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
