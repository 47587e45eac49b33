"""How the driver's costs grow with the job: simulated ranks (runmgr/scale/) through the real
worker group, controller, judge, logbook and metrics on a local Ray, one world size at a time,
each in a fresh process (its own Ray, its own peak memory).

    .venv/bin/python bench/scale.py [--sizes 8,64,512,2048] [--step-s 6] [--steps 12] [--hosts 4]

Every size meets the same faults: rank 1 killed at step 3, rank 2 hung at step 7 (the learned
hang timeout: 5 x the step). Per size it prints the
driver's CPU (share of one core, and per simulated step), the poll period it achieved (the
controller asks for 0.2 s), the seconds from the kill and the hang to their incidents, the
driver's peak memory, the logbook's size (and its sub-runs: most of it is each sub-run's and
each incident's record of every rank) and the metrics' series. The
ratio line compares the largest size with the smallest. Sizes the design cannot drive in
``--size-timeout`` seconds are extrapolated from the per-rank cost of the two largest that
ran (driver CPU per step, as a power of the ranks), and marked so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTS = [("kill", 1, 3), ("hang", 2, 7)]
"""A straggler needs 20 slow steps to be judged (tests/runmgr/scale/test_harness.py has one)."""


def one_size(ranks: int, step_s: float, steps: int, hosts: int, faults: bool = True) -> dict:
    """Runs in the child: one simulated job of ``ranks`` ranks, its figures as a dict."""
    import ray

    from runmgr.scale.harness import ScaleJob, run_job
    from runmgr.scale.ranks import RankFault

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    job = ScaleJob(ranks=ranks, hosts=hosts, step_s=step_s, train_iters=steps, save_interval=4,
                   hang_min_s=step_s * 2, faults=tuple(RankFault(kind, rank, step) for kind, rank, step in FAULTS) if faults else ())
    result = run_job(job, Path(tempfile.mkdtemp(prefix=f"scale-{ranks}-")) / "run")
    ray.shutdown()
    periods = sorted(result.poll_periods)
    first = {}
    for kind, seconds in result.incidents:
        first.setdefault(kind, seconds)
    return {"ranks": ranks, "nodes": result.nodes, "final": result.final, "cpu_s": result.driver_cpu_s,
            "wall_s": result.wall_s, "steps": result.steps,
            "poll_median_s": statistics.median(periods) if periods else None,
            "poll_p95_s": periods[int(0.95 * (len(periods) - 1))] if periods else None,
            "death_s": first.get("worker_death"), "hang_s": first.get("hang"), "straggler": "straggler" in first,
            "rss_mb": result.max_rss_mb, "logbook_bytes": result.logbook_bytes,
            "simulated_s": result.steps * step_s, "series": result.metric_series,
            "decisions": list(result.decisions), "memory": list(result.memory)}


def run_child(ranks: int, args: argparse.Namespace) -> dict | None:
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--child", str(ranks), "--step-s", str(args.step_s), "--steps", str(args.steps),
           "--hosts", str(args.hosts), *(["--hour"] if args.hour else [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.size_timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-3000:])
        return None
    return json.loads(lines[-1])


def row(r: dict, step_s: float, marked: str = "") -> str:
    core = r["cpu_s"] / r["wall_s"] * 100
    per_step = r["cpu_s"] / max(1, r["steps"])
    subruns = len(r["decisions"]) + 1
    def s(x):
        return f"{x:6.2f}" if isinstance(x, (int, float)) else "     -"
    return (f"{r['ranks']:>6} {r['nodes']:>5} {core:7.1f}% {per_step:8.3f} {s(r['poll_median_s'])} {s(r['poll_p95_s'])} "
            f"{s(r['death_s'])} {s(r['hang_s'])} {r['rss_mb']:7.0f} {r['logbook_bytes'] / 1e3:7.0f} {subruns:>3} "
            f"{r['series']:>6}  {r['final']}{marked}")


def extrapolated(r: dict, ranks: int) -> str:
    """``ranks`` from the largest size measured, marked so: the driver's CPU per poll per rank
    (today's design makes one call per rank per poll) held, at a driver of one full core."""
    per_poll = r["cpu_s"] / r["wall_s"] * r["poll_median_s"]
    per_rank_ms = per_poll / r["ranks"] * 1000
    poll = per_rank_ms * ranks / 1000
    return (f"{ranks:>6} {ranks // 8:>5}  EXTRAPOLATED from {r['ranks']} ranks ({per_rank_ms:.2f} ms of driver CPU "
            f"per rank per poll): a poll every >= {poll:.1f} s at 100% of one core, a death heard >= {poll + 1:.1f} s "
            f"after it (poll + 1 s settle)")


def hour(args: argparse.Namespace) -> int:
    """600 steps without a fault per size: the driver's resident memory every 50 steps."""
    print(f"an hour of 6 s steps (600 steps) at {args.step_s:g} s each, no fault: the driver's resident MB "
          f"every 50 steps")
    for ranks in [int(x) for x in args.sizes.split(",")]:
        r = run_child(ranks, args)
        if r is None:
            print(f"{ranks:>6}  did not finish in {args.size_timeout:.0f} s")
            continue
        memory = r["memory"]
        grew = memory[-1][1] - memory[1][1] if len(memory) > 2 else float("nan")
        print(f"{ranks:>6} ranks, {r['steps']} steps, poll50 {r['poll_median_s']:.2f} s: "
              + " ".join(f"{mb:.0f}" for _, mb in memory) + f"  (step 100 -> end: {grew:+.1f} MB)", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,512,2048")
    parser.add_argument("--step-s", type=float, default=6.0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--size-timeout", type=float, default=900.0)
    parser.add_argument("--extrapolate", default="16384",
                        help="sizes past the measured ones to extrapolate to (comma-separated; '' for none)")
    parser.add_argument("--hour", action="store_true",
                        help="an hour of 6 s steps (600 steps, no fault) at --step-s each: the driver's memory as it goes")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hour:
        args.steps = 600
    if args.child is not None:
        print(json.dumps(one_size(args.child, args.step_s, args.steps, args.hosts, faults=not args.hour)))
        return 0
    if args.hour:
        return hour(args)
    print(f"today's design: one drain call per rank per poll; {args.step_s:g} s steps, {args.steps} steps, "
          f"faults {FAULTS}")
    print("  ranks nodes  driver  cpu/step  poll50  poll95  death   hang  rss_MB  log_KB sub series  end")
    results = []
    for ranks in [int(x) for x in args.sizes.split(",")]:
        r = run_child(ranks, args)
        if r is None:
            if len(results) >= 2:
                a, b = results[-2], results[-1]
                cost_a, cost_b = (r["cpu_s"] / max(1, r["steps"]) for r in (a, b))
                power = math.log(cost_b / cost_a) / math.log(b["ranks"] / a["ranks"])
                per_step = cost_b * (ranks / b["ranks"]) ** power
                print(f"{ranks:>6}  did not finish in {args.size_timeout:.0f} s; extrapolated from {a['ranks']} and "
                      f"{b['ranks']} (CPU per step ~ ranks^{power:.2f}): {per_step:.1f} s of driver CPU per step, "
                      f"{per_step / args.step_s * 100:.0f}% of one core at {args.step_s:g} s steps")
            else:
                print(f"{ranks:>6}  did not finish in {args.size_timeout:.0f} s")
            continue
        results.append(r)
        print(row(r, args.step_s), flush=True)
    if results:
        for ranks in [int(x) for x in args.extrapolate.split(",") if x]:
            print(extrapolated(results[-1], ranks))
    if len(results) >= 2:
        a, b = results[0], results[-1]
        print(f"ratio driver CPU share {b['ranks']}/{a['ranks']} ranks: "
              f"{(b['cpu_s'] / b['wall_s']) / max(1e-9, a['cpu_s'] / a['wall_s']):.1f}x for {b['ranks'] / a['ranks']:.0f}x ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
