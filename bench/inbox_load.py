"""The agent design's inbox under one push per node per interval, as a real cluster makes it.

In the agent design every node's agent pushes one report per interval to one actor, the
driver's :class:`runmgr.workers.inbox.ReportInbox`, and the driver drains it with one call per
poll. bench/scale.py's hosts push all their simulated nodes' reports in one call; here each
simulated node makes its own ``push.remote`` call, so the inbox serves as many calls a second
as a cluster of that many nodes would make (issue 29: "the inbox at 2,048 agents").

What is real: the inbox actor (runmgr's own), Ray's actor calls and a driver draining every
``--poll-s`` as the agent group does. What is simulated: the agents, ``--pushers`` Ray actors
each making the calls of ``nodes / pushers`` nodes (one report with one heartbeat each, the
size of a quiet node's report), on the same 2 cores as the inbox and the driver.

    .venv/bin/python bench/inbox_load.py [--nodes 256,2048] [--step-s 1] [--poll-s 0.2] [--seconds 20] [--pushers 4]

A quiet node's beat changes once a step. Each size runs twice, side by side: ``every step``, a
push per node per step (the agents before runmgr/agents/cadence.py), and ``cadence``, a push per
node per beat interval (``beat_interval_s``: the step, or longer past 500 nodes' worth of calls
a second). Per size and cadence: the calls a second asked for and made, the inbox's, the pushers' and the driver's
share of one core, how old a report is when the driver has it (median and 99th percentile:
what the agents' push interval adds to the driver's hearing), whether every push was drained,
and the push calls' round trip. The ratio line compares the largest size with the smallest.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def make_pusher_class(ray):
    """The simulated agents of some nodes: one ``push`` call per node per interval."""
    from runmgr.agents.report import NodeReport
    from trainer.report import Heartbeat

    @ray.remote(num_cpus=0)
    class Pushers:
        def __init__(self, inbox, nodes: list[str], interval_s: float) -> None:
            self.inbox, self.nodes, self.interval_s = inbox, nodes, interval_s
            self.round_trips: list[float] = []
            self.calls = 0

        def pid(self) -> int:
            return os.getpid()

        async def run(self, seconds: float) -> dict:
            deadline = time.monotonic() + seconds
            step = 0
            while time.monotonic() < deadline:
                began = time.monotonic()
                step += 1
                sent = time.time()
                calls = [self.inbox.push.remote([NodeReport(node, "1.00", sent, beat=Heartbeat(0, "step", step, sent))])
                         for node in self.nodes]
                self.calls += len(calls)
                await asyncio.gather(*calls)
                self.round_trips.append(time.monotonic() - began)
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))
            return {"calls": self.calls, "round_trips": self.round_trips}

    return Pushers


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def one_size(ray, nodes: int, interval_s: float, args: argparse.Namespace) -> dict:
    from runmgr.workers.inbox import inbox_beside_driver

    inbox = inbox_beside_driver()
    inbox_pid = ray.get(inbox.__ray_call__.remote(lambda self: os.getpid()))
    names = [f"node-{i:05d}" for i in range(nodes)]
    pushers = [make_pusher_class(ray).remote(inbox, names[i::args.pushers], interval_s)
               for i in range(args.pushers)]
    pids = ray.get([p.pid.remote() for p in pushers])
    before = {pid: cpu_seconds(pid) for pid in [inbox_pid, *pids, os.getpid()]}
    started = time.monotonic()
    running = [p.run.remote(args.seconds) for p in pushers]
    ages: list[float] = []
    drained = 0
    while True:
        reports = ray.get(inbox.drain.remote(args.poll_s))
        now = time.time()
        drained += len(reports)
        ages.extend(now - report.sent for report in reports)
        done, _ = ray.wait(running, num_returns=len(running), timeout=0)
        if len(done) == len(running):
            break
    results = ray.get(running)
    drained += len(ray.get(inbox.drain.remote(0.0)))
    wall = time.monotonic() - started
    used = {pid: cpu_seconds(pid) - seconds for pid, seconds in before.items()}
    calls = sum(r["calls"] for r in results)
    round_trips = [t for r in results for t in r["round_trips"]]
    for actor in [*pushers, inbox]:
        ray.kill(actor, no_restart=True)
    return {"nodes": nodes, "interval_s": interval_s, "asked_per_s": nodes / interval_s, "made_per_s": calls / wall, "calls": calls,
            "drained": drained, "inbox_core": used[inbox_pid] / wall, "pushers_core": sum(used[p] for p in pids) / wall,
            "driver_core": used[os.getpid()] / wall, "age_p50": statistics.median(ages) if ages else float("nan"),
            "age_p99": percentile(ages, 0.99), "round_trip_p50": statistics.median(round_trips),
            "round_trip_max": max(round_trips)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="256,2048", help="simulated nodes, comma-separated")
    parser.add_argument("--step-s", type=float, default=1.0, help="the job's step time: a quiet node's beat changes once a step")
    parser.add_argument("--poll-s", type=float, default=0.2, help="the driver's drain wait (controller.poll_interval_s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each size pushes")
    parser.add_argument("--pushers", type=int, default=4, help="Ray actors making the simulated agents' calls")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from runmgr.agents.cadence import beat_interval_s
    from runmgr.cluster import keep_local_ray_offline

    keep_local_ray_offline(os.environ)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        print(f"quiet nodes whose beat changes every {args.step_s:g} s, one push call per node from {args.pushers} "
              f"pusher actors, the driver draining every {args.poll_s:g} s, {args.seconds:g} s per row, on "
              f"{os.cpu_count()} cores")
        print(f"{'nodes':>6} {'cadence':>10} {'every':>6} {'asked/s':>8} {'made/s':>8} {'inbox':>6} {'pushers':>8} "
              f"{'driver':>7} {'age p50':>8} {'age p99':>8} {'rt p50':>7}  drained")
        for nodes in [int(n) for n in args.nodes.split(",")]:
            cadences = {"every step": args.step_s, "cadence": max(args.step_s, beat_interval_s(args.poll_s, nodes))}
            for name, interval in cadences.items():
                r = {**one_size(ray, nodes, interval, args), "cadence": name}
                rows.append(r)
                print(f"{r['nodes']:>6} {name:>10} {interval:5.2f}s {r['asked_per_s']:8.0f} {r['made_per_s']:8.0f} "
                      f"{r['inbox_core'] * 100:5.1f}% {r['pushers_core'] * 100:7.1f}% {r['driver_core'] * 100:6.1f}% "
                      f"{r['age_p50']:7.3f}s {r['age_p99']:7.3f}s {r['round_trip_p50']:6.3f}s  "
                      f"{r['drained']} of {r['calls']}", flush=True)
    finally:
        ray.shutdown()
    largest = [r for r in rows if r["nodes"] == rows[-1]["nodes"]]
    if len(largest) == 2 and largest[1]["inbox_core"] > 0:
        before, after = largest
        print(f"ratio at {before['nodes']} nodes, every step / cadence: inbox CPU "
              f"x{before['inbox_core'] / after['inbox_core']:.1f}, calls made x{before['made_per_s'] / after['made_per_s']:.1f}, "
              f"report age p99 x{before['age_p99'] / after['age_p99']:.1f}")
    return 0 if all(r["drained"] == r["calls"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
