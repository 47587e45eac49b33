"""Restart latency after a lost worker: runmgr against Ray Train's TorchTrainer.

    .venv/bin/python bench/restart_latency.py [--trials N] [--iters 60]

The same fault on the same model: the demo's tiny LLaMA (trainer.model,
conf/demo.yaml's batch, sequence and AdamW), 2 CPU workers on gloo, a
checkpoint every 10 steps, ``kill -9`` of rank 1 once step 35 is reached.
Measured from the kill to the first step row of the next attempt, and the
steps lost (last step reached before the restart minus the step it resumed
from). Trials alternate runmgr, Ray Train, runmgr, ... so that the load of
this shared machine drifts into both alike.

- runmgr: `runmgr launch conf=demo`; rank 1's pid and the step come from
  status.json; the restart's first step is the first row of sub-run .01 in
  `runmgr logbook metrics --json` (the breakdown comes from the events).
- Ray Train 2.60 (v2, RAY_TRAIN_V2_ENABLED=1): TorchTrainer with
  FailureConfig(max_failures=3) in a child process of this script; the loop
  (ray_loop.py) builds the same model, optimizer and data from trainer.*,
  checkpoints model+optimizer with torch.save every 10 steps, resumes from
  ray.train.get_checkpoint(), and appends each step's wall time and pid to a
  file per rank, which is where this script finds the pid and the first step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import BenchError, Launch, logbook_rows, median, print_table  # noqa: E402
from ray_loop import RankLog, run_ray_trainer  # noqa: E402

KILL_AT_STEP = 35
SAVE_INTERVAL = 10
VICTIM_RANK = 1


def missing_ray_train_extras() -> list[str]:
    """What ``import ray.train`` needs beyond ray[default] (ray/train/__init__.py checks these)."""
    return [name for name in ("fsspec", "pandas", "pyarrow", "requests") if importlib.util.find_spec(name) is None]


def overrides(iters: int) -> list[str]:
    return [f"training.train_iters={iters}", f"checkpoint.save_interval={SAVE_INTERVAL}"]


def runmgr_trial(run_dir: Path, iters: int) -> dict:
    run = Launch(run_dir, overrides(iters)).start()
    try:
        pid, reached = run.worker_pid_at(KILL_AT_STEP, VICTIM_RANK)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        code = run.wait(timeout=300)
    finally:
        run.stop()
    if code != 0:
        raise BenchError(f"runmgr run {run_dir} exited {code}:\n{run.log_tail()}")
    rows = logbook_rows(run_dir, "metrics", "--all")
    events = logbook_rows(run_dir, "events")
    starts = [e for e in events if e["type"] == "subrun_start"]
    if len(starts) < 2:
        raise BenchError(f"runmgr run {run_dir}: no restart recorded ({len(starts)} sub-run(s))")
    first, second = starts[0]["subrun"], starts[1]["subrun"]
    first_step = min((r for r in rows if r["subrun"] == second), key=lambda r: r["time"])
    last_before = max(r["step"] for r in rows if r["subrun"] == first)
    incident = next(e for e in events if e["type"] == "incident" and e["time"] >= killed_at)
    started, ready = (next(e for e in events if e.get("kind") == kind and e["subrun"] == second)
                      for kind in ("workers_started", "effective_settings"))
    return {
        "kill_step": reached, "last_step": last_before, "resumed_step": starts[1]["start_step"],
        "detect_s": incident["time"] - killed_at, "workers_up_s": started["time"] - killed_at,
        "ready_s": ready["data"]["time"] - killed_at, "first_step_s": first_step["time"] - killed_at,
    }


def ray_trial(out_dir: Path, iters: int) -> dict:
    child = run_ray_trainer(out_dir, overrides(iters))
    victim = RankLog(out_dir, VICTIM_RANK)
    try:
        row = victim.wait_for(lambda r: r["kind"] == "step" and r["step"] >= KILL_AT_STEP, child, timeout=300)
        old_attempts = {r["attempt"] for r in victim.rows() + RankLog(out_dir, 0).rows()}
        os.kill(row["pid"], signal.SIGKILL)
        killed_at = time.time()
        code = child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    log_tail = (out_dir / "driver.log").read_text()[-2500:]
    if code != 0:
        raise BenchError(f"Ray Train run in {out_dir} exited {code}:\n{log_tail}")
    rank0 = RankLog(out_dir, 0).rows()
    new = [r for r in rank0 if r["attempt"] not in old_attempts]
    old_steps = [r["step"] for r in rank0 + victim.rows() if r["attempt"] in old_attempts and r["kind"] == "step"]
    first = {kind: min((r for r in new if r["kind"] == kind), key=lambda r: r["time"])
             for kind in ("start", "ready", "step")}
    return {
        "kill_step": row["step"], "last_step": max(old_steps), "resumed_step": first["ready"]["step"],
        "detect_s": float("nan"), "workers_up_s": first["start"]["time"] - killed_at,
        "ready_s": first["ready"]["time"] - killed_at, "first_step_s": first["step"]["time"] - killed_at,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="trials of each (alternating)")
    parser.add_argument("--iters", type=int, default=40, help="training.train_iters of each run (> 35)")
    args = parser.parse_args()
    missing = missing_ray_train_extras()
    if missing:
        print(f"Ray Train needs {', '.join(missing)}: install them with .venv/bin/pip install 'ray[train]==2.60.0' "
              f"(or put them on PYTHONPATH), then run again", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="restart-latency-"))
    print(f"kill -9 of rank {VICTIM_RANK} at step >= {KILL_AT_STEP}, checkpoint every {SAVE_INTERVAL}, "
          f"{args.iters} steps, {args.trials} trials each; runs in {base}", flush=True)
    results: dict[str, list[dict]] = {"runmgr": [], "RayTrain": []}
    table = []
    for trial in range(args.trials):
        for who in ("runmgr", "RayTrain"):
            where = base / f"t{trial}-{who}"
            figures = runmgr_trial(where, args.iters) if who == "runmgr" else ray_trial(where, args.iters)
            figures["steps_lost"] = figures["last_step"] - figures["resumed_step"]
            results[who].append(figures)
            table.append([trial, who, figures["kill_step"], figures["last_step"], figures["resumed_step"],
                          figures["steps_lost"], figures["detect_s"], figures["workers_up_s"],
                          figures["ready_s"], figures["first_step_s"]])
            print(f"  {who} trial {trial}: first step {figures['first_step_s']:.2f} s after the kill", flush=True)
    headers = ["trial", "who", "kill_step", "last_step", "resumed", "lost", "kill->incident_s",
               "kill->workers_up_s", "kill->ready_s", "kill->first_step_s"]
    print_table(headers, table)
    med = {who: {k: median([r[k] for r in rows]) for k in rows[0]} for who, rows in results.items()}
    print_table(["who", "median kill->first_step_s", "median steps lost"],
                [[who, med[who]["first_step_s"], med[who]["steps_lost"]] for who in results])
    ratio = med["runmgr"]["first_step_s"] / med["RayTrain"]["first_step_s"]
    print(f"ratio runmgr/RayTrain kill->first step: {ratio:.3f}x (lower is better for runmgr); "
          f"steps lost {med['runmgr']['steps_lost']:g} vs {med['RayTrain']['steps_lost']:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
