"""Kill one worker with SIGKILL at random moments of real runs and check that
each run still finishes with per-step losses bit-for-bit equal to an
uninterrupted run (issue: "kill -9 of any one worker at any moment").

    .venv/bin/python bench/kill_anywhere.py --trials 6 [--seed 1]

Each trial starts `runmgr launch` (local Ray, 2 ranks, gloo), waits a random
time (during start-up, mid-step or during an async checkpoint write), kills a
random rank, lets the run finish and compares `runmgr logbook metrics`.
Prints one line per trial and a final tally.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import LaunchedRun, kept_losses, runmgr_json_lines  # noqa: E402


def kill_at_random(run: LaunchedRun, rng: random.Random, max_step: int) -> str:
    target_step = rng.randint(0, max_step)
    rank = rng.randint(0, 1)
    status = run.wait_for(lambda s: s["state"] == "running" and s["step"] >= target_step and s["workers"],
                          timeout=240, what=f"step {target_step}")
    time.sleep(rng.uniform(0, 0.15))  # land anywhere inside a step or a checkpoint write
    pid = next(w["pid"] for w in status["workers"] if w["rank"] == rank)
    os.kill(pid, signal.SIGKILL)
    return f"killed rank {rank} (pid {pid}) at step ~{status['step']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="kill-anywhere-"))
    reference = LaunchedRun(base / "reference").start()
    assert reference.wait() == 0, reference.output()[-2000:]
    expected = kept_losses(reference.run_dir)
    ok = 0
    for trial in range(args.trials):
        run = LaunchedRun(base / f"trial{trial}").start()
        what = kill_at_random(run, rng, max_step=38)
        code = run.wait()
        losses = kept_losses(run.run_dir) if code == 0 else {}
        events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json") if code == 0 else []
        starts = [e for e in events if e["type"] == "subrun_start"]
        equal = losses == expected
        ok += equal
        resumed = ", ".join(f"{s['subrun']} from step {s['start_step']}" for s in starts[1:]) or "no restart"
        print(json.dumps({"trial": trial, "kill": what, "exit": code, "subruns": resumed,
                          "bit_for_bit": equal}), flush=True)
    print(f"{ok} passed, {args.trials - ok} failed")
    return 0 if ok == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
