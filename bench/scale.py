"""How the driver's costs grow with the job, in both designs side by side: simulated ranks
(runmgr/scale/) through the real worker group, controller, judge, logbook and metrics on a
local Ray, one world size and design at a time, each in a fresh process (its own Ray, its own
peak memory). ``per_rank``: today's group, one actor per rank drained every poll; ``agents``:
one agent per node pushing a summary to an inbox, one drain per poll; ``warm``: the agents with
warm spares under them (runmgr/workers/warm_agents.py's WarmAgentGroup, as a launch with
``controller.warm_spares`` builds it), one spare per 64 ranks (at least one), in the slots after
the ranks' (spare-only nodes): a kill is recovered in place on a spare, the survivors going on.

    .venv/bin/python bench/scale.py [--sizes 8,64,512,2048,16384] [--step-s 6] [--steps 12]
        [--designs per_rank,agents,warm] [--per-rank-max 4096] [--hosts 4] [--hour]

Every size meets the same faults: rank 1 killed at step 3, rank 2 hung at step 7 (the learned
hang timeout: 5 x the step). Per size it prints the
driver's CPU (share of one core, and per simulated step), the poll period it achieved (the
controller asks for 0.2 s), the seconds from the kill and the hang to their incidents, the
driver's peak memory, the logbook's size (and its sub-runs: most of it is each sub-run's and
each incident's record of every rank) and the metrics' series. ``resume``: the seconds from the
kill to the next sub-run running, the driver's side of the recovery (cold: the group stopped and
every rank started again; warm: the survivors waited for, the spare named, each node answered);
a simulated rank starts at once and a simulated rejoin moves no state, so neither a real
restart's process starts and checkpoint load nor a real rejoin's process group and state
transfer are in it. ``how``: how each fault was gotten past (warm: on a spare; cold: a restart
of every rank). The
ratio line compares the largest size with the smallest. Sizes the design cannot drive in
``--size-timeout`` seconds, and ``per_rank`` sizes above ``--per-rank-max``, are extrapolated
from the largest that ran, and marked so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTS = [("kill", 1, 3), ("hang", 2, 7)]
"""A straggler needs 20 slow steps to be judged (tests/runmgr/scale/test_harness.py has one)."""


def spares_for(ranks: int) -> int:
    """The warm arm's spares: one per 64 ranks (eight nodes of eight), at least one."""
    return max(1, ranks // 64)


def one_size(ranks: int, design: str, step_s: float, steps: int, hosts: int, faults: bool = True) -> dict:
    """Runs in the child: one simulated job of ``ranks`` ranks, its figures as a dict."""
    import ray

    from runmgr.scale.harness import ScaleJob, run_job
    from runmgr.cluster import keep_local_ray_offline
    from runmgr.scale.ranks import RankFault

    keep_local_ray_offline(os.environ)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    job = ScaleJob(ranks=ranks, design=design, hosts=hosts, step_s=step_s, train_iters=steps, save_interval=4,
                   warm_spares=spares_for(ranks),
                   hang_min_s=step_s * 2, faults=tuple(RankFault(kind, rank, step) for kind, rank, step in FAULTS) if faults else ())
    result = run_job(job, Path(tempfile.mkdtemp(prefix=f"scale-{ranks}-")) / "run")
    ray.shutdown()
    periods = sorted(result.poll_periods)
    first, resumed = {}, {}
    for (kind, seconds), back in zip(result.incidents, result.resumed):
        first.setdefault(kind, seconds)
        resumed.setdefault(kind, back)
    how = [f"{'kill' if kind == 'worker_death' else kind}:{restart}"
           for (kind, _), restart in zip(result.incidents, result.restarts)]
    return {"ranks": ranks, "design": design, "nodes": result.nodes, "final": result.final, "cpu_s": result.driver_cpu_s,
            "wall_s": result.wall_s, "steps": result.steps,
            "poll_median_s": statistics.median(periods) if periods else None,
            "poll_p95_s": periods[int(0.95 * (len(periods) - 1))] if periods else None,
            "death_s": first.get("worker_death"), "hang_s": first.get("hang"), "straggler": "straggler" in first,
            "resumed_s": resumed.get("worker_death"), "how": " ".join(how), "started_ranks": result.started_ranks,
            "spares": job.spares,
            "rss_mb": result.max_rss_mb, "logbook_bytes": result.logbook_bytes,
            "simulated_s": result.steps * step_s, "series": result.metric_series,
            "decisions": list(result.decisions), "memory": list(result.memory)}


def run_child(ranks: int, design: str, args: argparse.Namespace) -> dict | None:
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--child", str(ranks), "--design", design, "--step-s", str(args.step_s), "--steps", str(args.steps),
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
    return (f"{r['ranks']:>6} {r['nodes']:>5} {r['design']:>8} {core:7.1f}% {per_step:8.3f} {s(r['poll_median_s'])} {s(r['poll_p95_s'])} "
            f"{s(r['death_s'])} {s(r['hang_s'])} {s(r.get('resumed_s'))} {r['rss_mb']:7.0f} {r['logbook_bytes'] / 1e3:7.0f} "
            f"{subruns:>3} {r['series']:>6}  {r['final']}  {r.get('how', '')}{marked}")


def extrapolated(r: dict, ranks: int) -> str:
    """``ranks`` from the largest size measured, marked so. ``per_rank``: its driver's CPU per
    poll per rank (one call per rank per poll) held, at a driver of one full core. ``agents``: its
    driver's CPU share grown in proportion to the nodes (an upper bound: part of it is fixed)."""
    if r["design"] in ("agents", "warm"):
        share = r["cpu_s"] / r["wall_s"] * 100 * ranks / r["ranks"]
        return (f"{ranks:>6} {ranks // 8:>5} {r['design']:>8}  EXTRAPOLATED from {r['ranks']} ranks: at most "
                f"{share:.1f}% of one core (the driver's share grown with the nodes)")
    per_poll = r["cpu_s"] / r["wall_s"] * r["poll_median_s"]
    per_rank_ms = per_poll / r["ranks"] * 1000
    poll = per_rank_ms * ranks / 1000
    return (f"{ranks:>6} {ranks // 8:>5} {r['design']:>8}  EXTRAPOLATED from {r['ranks']} ranks ({per_rank_ms:.2f} ms "
            f"of driver CPU per rank per poll): a poll every >= {poll:.1f} s at 100% of one core, a death heard "
            f">= {poll + 1:.1f} s after it (poll + 1 s settle)")


def hour(args: argparse.Namespace) -> int:
    """600 steps without a fault per size and design: the driver's resident memory every 50
    steps, and the logbook's bytes over the hour."""
    print(f"an hour of 6 s steps (600 steps) at {args.step_s:g} s each, no fault: the driver's resident MB "
          f"every 50 steps, the logbook's KB after the hour")
    for ranks in [int(x) for x in args.sizes.split(",")]:
        for design in designs_for(ranks, args):
            r = run_child(ranks, design, args)
            if r is None:
                print(f"{ranks:>6} {design:>8}  did not finish in {args.size_timeout:.0f} s")
                continue
            memory = r["memory"]
            grew = memory[-1][1] - memory[1][1] if len(memory) > 2 else float("nan")
            print(f"{ranks:>6} {design:>8} {r['steps']} steps, poll50 {r['poll_median_s']:.2f} s, driver "
                  f"{r['cpu_s'] / r['wall_s'] * 100:.1f}%, logbook {r['logbook_bytes'] / 1e3:.0f} KB: "
                  + " ".join(f"{mb:.0f}" for _, mb in memory) + f"  (step 100 -> end: {grew:+.1f} MB)", flush=True)
    return 0


def designs_for(ranks: int, args: argparse.Namespace) -> list[str]:
    """The designs run at ``ranks``: ``per_rank`` only up to ``--per-rank-max``."""
    return [d for d in args.designs.split(",") if d != "per_rank" or ranks <= args.per_rank_max]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,512,2048,16384")
    parser.add_argument("--designs", default="per_rank,agents,warm")
    parser.add_argument("--per-rank-max", type=int, default=4096,
                        help="per_rank sizes above it are extrapolated, not run (it cannot keep up)")
    parser.add_argument("--step-s", type=float, default=6.0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--size-timeout", type=float, default=900.0)
    parser.add_argument("--extrapolate", default="16384",
                        help="sizes past the measured ones to extrapolate to (comma-separated; '' for none)")
    parser.add_argument("--hour", action="store_true",
                        help="an hour of 6 s steps (600 steps, no fault) at --step-s each: the driver's memory as it goes")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--design", default="per_rank", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hour:
        args.steps = 600
    if args.child is not None:
        print(json.dumps(one_size(args.child, args.design, args.step_s, args.steps, args.hosts, faults=not args.hour)))
        return 0
    if args.hour:
        return hour(args)
    print(f"per_rank: one drain call per rank per poll; agents: one agent per node pushes, one drain per poll; "
          f"warm: agents and one spare per 64 ranks; {args.step_s:g} s steps, {args.steps} steps, faults {FAULTS}")
    print("  ranks nodes   design  driver  cpu/step  poll50  poll95  death   hang resume  rss_MB  log_KB sub series  end  how")
    results: dict[str, list[dict]] = {}
    for ranks in [int(x) for x in args.sizes.split(",")]:
        ran = {}
        for design in args.designs.split(","):
            done = results.setdefault(design, [])
            if design not in designs_for(ranks, args):
                if done:
                    print(extrapolated(done[-1], ranks))
                continue
            r = run_child(ranks, design, args)
            if r is None:
                print(f"{ranks:>6} {'':>5} {design:>8}  did not finish in {args.size_timeout:.0f} s"
                      + (f"; {extrapolated(done[-1], ranks).split('  ', 1)[1]}" if done else ""))
                continue
            done.append(r)
            ran[design] = r
            print(row(r, args.step_s), flush=True)
        if "per_rank" in ran and "agents" in ran:
            a, b = ran["per_rank"], ran["agents"]
            print(f"{'':>13} ratio driver CPU per_rank/agents: "
                  f"{(a['cpu_s'] / a['wall_s']) / max(1e-9, b['cpu_s'] / b['wall_s']):.1f}x", flush=True)
    for design, done in results.items():
        if done:
            for ranks in [int(x) for x in args.extrapolate.split(",") if x]:
                if ranks > done[-1]["ranks"] and ranks not in [int(x) for x in args.sizes.split(",")]:
                    print(extrapolated(done[-1], ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
