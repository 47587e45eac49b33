"""Restart latency after a lost worker: runmgr's warm and cold restarts, Ray Train's
TorchTrainer and torchrun elastic, on the same model and fault.

    PYTHONPATH=/tmp/raytrain-extras .venv/bin/python bench/restart_latency.py [--trials 5] [--iters 60]

The demo's tiny LLaMA (trainer.model, conf/demo.yaml's batch, sequence and
AdamW), 2 CPU workers on gloo, a checkpoint every 10 steps, ``kill -9`` of
rank 1 once a step drawn at random (the same for every system of a trial) is
reached. Measured from the kill to the first step row of the next attempt,
and the steps lost (last step recorded before the restart minus the step it
resumed from). Trials alternate the systems, so the load of this shared
machine drifts into all alike.

- runmgr-warm: `runmgr launch conf=demo controller.warm_spares=1
  checkpoint.memory_interval=1`: one ready spare; in plain data parallel the
  survivor's live state is the copy (trainer/live.py); the ranks and the spare are
  forked under node agents (runmgr/workers/warm_agents.py).
  runmgr-warm-node: the same on three local Ray nodes (two ranks and the
  spare), and the victim's whole node is killed (its raylet, and the rank's
  process line up to it: the rank, its agent's fork server, the agent).
  runmgr-warm-zero1: ZeRO-1 (`parallel.use_distributed_optimizer=true`): each
  rank's optimizer shard is its own, so a memory snapshot every step goes to
  its buddy, which donates it.
- runmgr-cold: `runmgr launch conf=demo` (every rank a new process, state
  from the newest verified checkpoint). rank 1's pid and the step come from
  status.json; the restart's first step is the first row of sub-run .01 in
  `runmgr logbook metrics --json` (the breakdown comes from the events).
- RayTrain, 2.60 (v2, RAY_TRAIN_V2_ENABLED=1): TorchTrainer with
  FailureConfig(max_failures=3) in a child process of this script; the loop
  (ray_loop.py) builds the same model, optimizer and data from trainer.*,
  checkpoints model+optimizer with torch.save every 10 steps, resumes from
  ray.train.get_checkpoint(), and appends each step's wall time and pid to a
  file per rank, which is where this script finds the pid and the first step.
- torchrun: elastic, `--max-restarts=3`, c10d rendezvous on 127.0.0.1,
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, over `python -m trainer conf=demo`
  (torchrun_elastic.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import BenchError, Launch, logbook_rows, median, print_table  # noqa: E402
from ray_loop import RankLog, run_ray_trainer  # noqa: E402
from torchrun_elastic import torchrun_trial  # noqa: E402

SAVE_INTERVAL = 10
VICTIM_RANK = 1
WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1"]
WARM_ZERO1 = [*WARM, "parallel.use_distributed_optimizer=true"]
NODES = ["cluster.local_nodes=3", "cluster.num_workers=2", "cluster.cpus_per_worker=1"]
"""Three local Ray nodes of one rank each: two ranks and the spare, each on its own node."""


def missing_ray_train_extras() -> list[str]:
    """What ``import ray.train`` needs beyond ray[default] (ray/train/__init__.py checks these)."""
    return [name for name in ("fsspec", "pandas", "pyarrow", "requests") if importlib.util.find_spec(name) is None]


def overrides(iters: int) -> list[str]:
    return [f"training.train_iters={iters}", f"checkpoint.save_interval={SAVE_INTERVAL}"]


def runmgr_trial(run_dir: Path, iters: int, kill_step: int, extra: list[str], node: bool = False) -> dict:
    """``node``: kill the victim's whole Ray node (its raylet and the rank's ancestors up to it), not only the rank."""
    run = Launch(run_dir, [*overrides(iters), *extra]).start()
    try:
        pid, reached = run.worker_pid_at(kill_step, VICTIM_RANK)
        victims = _up_to_raylet(pid) if node else [pid]
        for victim in victims:
            os.kill(victim, signal.SIGKILL)
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
    started = next(e for e in events if e.get("kind") == "workers_started" and e["subrun"] == second)
    ready = next((e["data"]["time"] for e in events if e.get("kind") == "effective_settings"
                  and e["subrun"] == second), started["time"])  # a warm restart starts no trainer afresh
    return {
        "kill_step": reached, "last_step": last_before, "resumed_step": starts[1]["start_step"],
        "detect_s": incident["time"] - killed_at, "workers_up_s": started["time"] - killed_at,
        "ready_s": ready - killed_at, "first_step_s": first_step["time"] - killed_at,
        "restart": starts[1]["evidence"].get("restart", "cold"),
    }


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _up_to_raylet(pid: int) -> list[int]:
    """A forked rank and its ancestors up to its node's raylet, the raylet included: the rank,
    its agent's fork server, the agent (a Ray worker), the raylet."""
    line = [pid]
    while Path(f"/proc/{line[-1]}/comm").read_text().strip() != "raylet":
        parent = _parent(line[-1])
        if parent <= 1:
            raise BenchError(f"rank pid {pid} has no raylet among its ancestors ({line})")
        line.append(parent)
    return line


def ray_trial(out_dir: Path, iters: int, kill_step: int) -> dict:
    child = run_ray_trainer(out_dir, overrides(iters))
    victim = RankLog(out_dir, VICTIM_RANK)
    try:
        row = victim.wait_for(lambda r: r["kind"] == "step" and r["step"] >= kill_step, child, timeout=300)
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
        "restart": "cold",
    }


SYSTEMS = ("runmgr-warm", "runmgr-cold", "RayTrain", "torchrun", "runmgr-warm-node", "runmgr-warm-zero1")


def trial(who: str, where: Path, iters: int, kill_step: int) -> dict:
    if who == "runmgr-warm":
        return runmgr_trial(where, iters, kill_step, WARM)
    if who == "runmgr-warm-zero1":
        return runmgr_trial(where, iters, kill_step, WARM_ZERO1)
    if who == "runmgr-warm-node":
        return runmgr_trial(where, iters, kill_step, [*WARM, *NODES], node=True)
    if who == "runmgr-cold":
        return runmgr_trial(where, iters, kill_step, [])
    if who == "RayTrain":
        return ray_trial(where, iters, kill_step)
    figures = torchrun_trial(where, overrides(iters), kill_step, VICTIM_RANK)
    figures["restart"] = "cold"
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials of each (alternating)")
    parser.add_argument("--iters", type=int, default=60, help="training.train_iters of each run")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill steps")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    args = parser.parse_args()
    systems = [name for name in args.systems.split(",") if name]
    unknown = [name for name in systems if name not in SYSTEMS]
    if unknown:
        print(f"unknown system {unknown[0]!r}: choose from {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    missing = missing_ray_train_extras() if "RayTrain" in systems else []
    if missing:
        print(f"Ray Train needs {', '.join(missing)}: install them with .venv/bin/pip install 'ray[train]==2.60.0' "
              f"(or put them on PYTHONPATH), then run again", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="restart-latency-"))
    rng = random.Random(args.seed)
    kill_steps = [rng.randint(20, args.iters - 15) for _ in range(args.trials)]
    print(f"kill -9 of rank {VICTIM_RANK} at a random step ({kill_steps}), checkpoint every {SAVE_INTERVAL}, "
          f"{args.iters} steps, {args.trials} trials of each of {', '.join(systems)}; runs in {base}", flush=True)
    results: dict[str, list[dict]] = {who: [] for who in systems}
    table = []
    for number, kill_step in enumerate(kill_steps):
        for who in systems:
            figures = trial(who, base / f"t{number}-{who}", args.iters, kill_step)
            figures["steps_lost"] = figures["last_step"] - figures["resumed_step"]
            results[who].append(figures)
            table.append([number, who, figures["restart"], figures["kill_step"], figures["last_step"],
                          figures["resumed_step"], figures["steps_lost"], figures["detect_s"],
                          figures["workers_up_s"], figures["ready_s"], figures["first_step_s"]])
            print(f"  {who} trial {number}: first step {figures['first_step_s']:.2f} s after the kill, "
                  f"{figures['steps_lost']} step(s) lost", flush=True)
    print_table(["trial", "who", "restart", "kill_step", "last_step", "resumed", "lost", "kill->incident_s",
                 "kill->workers_up_s", "kill->ready_s", "kill->first_step_s"], table)
    summary = []
    for who, rows in results.items():
        times, lost = [r["first_step_s"] for r in rows], [r["steps_lost"] for r in rows]
        summary.append([who, median(times), min(times), max(times), median(lost), min(lost), max(lost)])
    print_table(["who", "median kill->first_step_s", "min", "max", "median steps lost", "min", "max"], summary)
    reference = systems[0]
    for who in systems[1:]:
        ratio = median([r["first_step_s"] for r in results[who]]) / median([r["first_step_s"]
                                                                            for r in results[reference]])
        print(f"ratio {who}/{reference} kill->first step: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
