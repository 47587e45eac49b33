"""Hang detection latency against the configured (learned) timeout.

    .venv/bin/python bench/hang_latency.py [--trials N]

Each trial launches the demo with a small learned step timeout
(watcher.hang.step.min_s=5, safety_factor=5: timeout = max(5 x the longest
step seen, 5 s)) and a collective timeout far above it
(parallel.dist_timeout_s=120, so gloo cannot end the hang first), waits for
step 20, SIGSTOPs rank 1 (the process stays alive and silent: a real hang,
its peer blocks in all_reduce), and measures from the SIGSTOP to:

- the ``hang`` incident in `runmgr logbook events --json`, against the
  effective timeout in the incident's evidence (runmgr/watch/hang.py);
- the first step row of the next sub-run in `runmgr logbook metrics --json`;

and checks that py-spy stacks of every rank were dumped under
<run dir>/stacks/<sub-run>/. The stopped process is killed at the end if
runmgr left it behind (that is reported too).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import BenchError, Launch, logbook_rows, median, print_table  # noqa: E402

STOP_AT_STEP = 20
VICTIM_RANK = 1
OVERRIDES = ["training.train_iters=40", "checkpoint.save_interval=10", "watcher.hang.step.min_s=5",
             "watcher.hang.safety_factor=5", "parallel.dist_timeout_s=120"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(run: Launch, pid: int, timeout: float) -> float:
    """When the stopped worker ``pid`` stopped existing (NaN: the driver exited first)."""
    deadline = time.time() + timeout
    while time.time() < deadline and run.proc.poll() is None:
        if not alive(pid):
            return time.time()
        time.sleep(0.05)
    return float("nan")


def stack_dumps(run_dir: Path, subrun: str) -> dict[str, str]:
    """rank file -> 'stack' when py-spy printed frames, else the first line it printed."""
    out = {}
    for path in sorted((run_dir / "stacks" / subrun).glob("rank*.txt")):
        lines = path.read_text().splitlines()
        frames = [line for line in lines[1:] if line.strip().startswith(("Thread", "Process"))]
        out[path.stem] = "stack" if frames else (lines[1] if len(lines) > 1 else "empty")
    return out


def trial(run_dir: Path) -> dict:
    run = Launch(run_dir, OVERRIDES).start()
    pid = None
    try:
        pid, reached = run.worker_pid_at(STOP_AT_STEP, VICTIM_RANK)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.time()
        gone_at = wait_gone(run, pid, timeout=300)
        code = run.wait(timeout=300)
    finally:
        run.stop()
        left_behind = pid is not None and alive(pid)
        if left_behind:  # our own stopped worker: never leave it frozen on a shared machine
            os.kill(pid, signal.SIGKILL)
    if code != 0:
        raise BenchError(f"run {run_dir} exited {code}:\n{run.log_tail()}")
    events = logbook_rows(run_dir, "events")
    hang = next((e for e in events if e["type"] == "incident" and e["kind"] == "hang"), None)
    if hang is None:
        kinds = [e.get("kind") for e in events if e["type"] == "incident"]
        raise BenchError(f"run {run_dir}: no hang incident after the SIGSTOP (incidents: {kinds})")
    silent = hang["evidence"]["evidence"]["silent"]
    timeout_s = max(s["timeout_s"] for s in silent)
    starts = [e for e in events if e["type"] == "subrun_start"]
    if len(starts) < 2:
        raise BenchError(f"run {run_dir}: no sub-run after the hang incident")
    rows = [r for r in logbook_rows(run_dir, "metrics") if r["subrun"] == starts[1]["subrun"]]
    started = next(e for e in events if e.get("kind") == "workers_started" and e["subrun"] == starts[1]["subrun"])
    return {
        "stop_step": reached, "timeout_s": timeout_s, "detect_s": hang["time"] - stopped_at,
        "silent_s": max(s["silent_s"] for s in silent), "ranks": ",".join(str(s["rank"]) for s in silent),
        "gone_s": gone_at - stopped_at, "workers_up_s": started["time"] - stopped_at,
        "first_step_s": min(r["time"] for r in rows) - stopped_at,
        "stacks": stack_dumps(run_dir, hang["subrun"]), "left_behind": left_behind,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hang-latency-"))
    print(f"SIGSTOP of rank {VICTIM_RANK} at step >= {STOP_AT_STEP}; {' '.join(OVERRIDES)}; "
          f"{args.trials} trials; runs in {base}", flush=True)
    results, table = [], []
    for number in range(args.trials):
        figures = trial(base / f"t{number}")
        results.append(figures)
        table.append([number, figures["stop_step"], figures["ranks"], figures["timeout_s"], figures["silent_s"],
                      figures["detect_s"], figures["detect_s"] / figures["timeout_s"], figures["gone_s"],
                      figures["workers_up_s"], figures["first_step_s"],
                      " ".join(f"{k}:{v}" for k, v in figures["stacks"].items()) or "none",
                      figures["left_behind"]])
        print(f"  trial {number}: hang incident {figures['detect_s']:.2f} s after the SIGSTOP", flush=True)
    print_table(["trial", "stop_step", "silent_ranks", "timeout_s", "silent_s", "stop->incident_s",
                 "detect/timeout", "stop->victim_gone_s", "stop->workers_up_s", "stop->first_step_s", "stacks", "victim_left"], table)
    detect = median([r["detect_s"] for r in results])
    timeout = median([r["timeout_s"] for r in results])
    ratio = median([r["detect_s"] / r["timeout_s"] for r in results])
    print(f"ratio detection latency / configured timeout: {ratio:.3f}x (median detection {detect:.2f} s, "
          f"timeout {timeout:.2f} s); median SIGSTOP -> first step of the next sub-run "
          f"{median([r['first_step_s'] for r in results]):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
