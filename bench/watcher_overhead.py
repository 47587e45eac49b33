"""The watcher's cost: step time of the same demo run with the watcher on and off.

    .venv/bin/python bench/watcher_overhead.py [--trials N] [--iters 150] [--snapshots]

With ``--snapshots`` the "on" arm also keeps the warm path's state
(``checkpoint.memory_interval=1``) and one ready spare
(``controller.warm_spares=1``); the "off" arm has neither. The demo trains in
plain data parallel, where a replica's live state is the warm copy: no
snapshot is taken (trainer/live.py), and what is left is the driver's work,
Ray's, and the waiting spare's.

Each trial runs the demo twice, watcher on then off (on, off, on, off, ...:
interleaved so that the load of this shared machine drifts into both arms
alike), same seed, same steps. ``watcher.enabled=false`` turns every detector
off (runmgr/controller/judge.py); worker deaths would still be judged.

Per run it reports, from ``runmgr logbook metrics RUN --json``: the median
step_time the trainer measured, the median wall interval between consecutive
step rows, the training span (first to last step row), and the span from step
``STEADY_FROM`` on (the "on" arm's spare starts beside the first steps: a
one-time cost at a run's start, not a cost per step). And the CPU seconds per
step of the run's whole process tree (driver, local Ray, ranks, spare) over
the steady steps: what the watcher, the snapshots and the spare cost this
2-core machine, whose two ranks leave no core idle, without the drift of
wall time that other load brings. The watcher runs
in the driver, not in the ranks, so the ratios should be about 1.0.

The driver is ``runmgr.launch.launch`` called in a child process of this
script (what `runmgr launch` calls), with ``Judge.judge`` wrapped to time
the driver's own work per poll: wall and CPU (thread_time) per step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import BenchError, Launch, logbook_rows, median, print_table, tree_cpu_seconds  # noqa: E402


def drive(profile_path: Path, overrides: list[str]) -> int:
    """Child mode: launch the demo in this process, timing every Judge.judge call."""
    from runmgr.controller.judge import Judge
    from runmgr.launch import launch
    from runmgr.preflight import LaunchRequest, prepare_launch

    totals = {"calls": 0, "wall_s": 0.0, "cpu_s": 0.0}
    judge = Judge.judge

    def timed_judge(self, *args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return judge(self, *args, **kwargs)
        finally:
            totals["wall_s"] += time.perf_counter() - wall
            totals["cpu_s"] += time.thread_time() - cpu
            totals["calls"] += 1

    Judge.judge = timed_judge
    code = launch(prepare_launch(LaunchRequest("demo", tuple(overrides))))
    profile_path.write_text(json.dumps(totals))
    return code


STEADY_FROM = 30
"""The steady span starts at this step: by then the "on" arm's spare has started (a process that
imports torch, builds the model and pays the optimizer's first step, once, beside the ranks)."""


def step_figures(run_dir: Path) -> dict:
    rows = logbook_rows(run_dir, "metrics")
    if not rows:
        raise BenchError(f"no step rows in {run_dir}")
    times = [row["time"] for row in rows]
    steady = [row["time"] for row in rows if row["step"] >= STEADY_FROM]
    return {
        "steps": len(rows),
        "step_time": median([row["step_time"] for row in rows]),
        "interval": median([b - a for a, b in zip(times, times[1:])]),
        "span": times[-1] - times[0],
        "steady_span": steady[-1] - steady[0],
    }


WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1"]
LAYOUTS = {"dp": (), "zero1": ("parallel.use_distributed_optimizer=true",)}
"""Both arms' layout: the demo's plain data parallel, or ZeRO-1 (whose warm state is a snapshot)."""
STEADY_UNTIL = 10
"""The CPU window ends this many steps before the last one (the run's processes still live)."""
ROLES = ("driver", "ranks", "spare", "agent", "ray")
"""Who in a run's process tree spends CPU: the driver (watcher, policy, logbook), the ranks,
a waiting spare, the node agent (the Ray actor that forks and hears the ranks, and its fork
server), and Ray's own processes (raylets, GCS, dashboard agents)."""


def process_cpu(root: int) -> dict[int, tuple[float, int]]:
    """CPU seconds so far and parent pid of ``root`` and every live process below it."""
    return {pid: (seconds, parent(pid)) for pid, seconds in tree_cpu_seconds(root).items()}


def parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile
        return 0
    return int(stat[stat.rindex(")") + 2:].split()[1])  # the command name may hold spaces


def roles(processes: dict[int, tuple[float, int]], driver: int, ranks: set[int]) -> dict[int, str]:
    """Each process's role. The ranks and spares are forked from their node agent's fork server
    (runmgr/agents/rank_processes.py), so they all carry the server's command line
    (``multiprocessing.forkserver``) and no name of their own; the ranks are known by the pids the
    run's status names, and a spare is any other child of the server that forked them. The server
    and the agent above it (``ray::NodeAgent``) are the agent's."""
    servers = {processes[pid][1] for pid in ranks if pid in processes}
    agents = {processes[server][1] for server in servers if server in processes}
    out = {}
    for pid, (_, ppid) in processes.items():
        if pid == driver:
            out[pid] = "driver"
        elif pid in ranks:
            out[pid] = "ranks"
        elif ppid in servers:
            out[pid] = "spare"
        else:
            out[pid] = "agent" if pid in servers or pid in agents else "ray"
    return out


def steady_cpu_per_step(run: Launch, iters: int) -> dict[str, float]:
    """CPU seconds a step costs each role of the run (:data:`ROLES`) from step ``STEADY_FROM``
    to ``iters - STEADY_UNTIL``. Unlike wall time, which drifts with whatever else this shared
    machine does (here +-10% between runs a minute apart), a process's own CPU time per step
    moves little."""
    first = run.wait_for(lambda s: s["step"] >= STEADY_FROM and s["workers"], timeout=300, what=f"step {STEADY_FROM}")
    ranks = {worker["pid"] for worker in first["workers"]}
    before = process_cpu(run.proc.pid)
    last = run.wait_for(lambda s: s["step"] >= iters - STEADY_UNTIL, timeout=300, what=f"step {iters - STEADY_UNTIL}")
    after = process_cpu(run.proc.pid)
    steps = max(1, last["step"] - first["step"])
    spent = dict.fromkeys(ROLES, 0.0)
    count = dict.fromkeys(ROLES, 0)
    for pid, who in roles(after, run.proc.pid, ranks).items():
        spent[who] += after[pid][0] - before.get(pid, (0.0, 0))[0]
        count[who] += 1
    print(f"    processes by role: " + ", ".join(f"{who} {n}" for who, n in count.items()), flush=True)
    return {name: seconds / steps for name, seconds in spent.items()}


def one_run(base: Path, name: str, enabled: bool, iters: int, snapshots: bool = False,
            common: tuple[str, ...] = ()) -> dict:
    run_dir = base / name
    profile = base / f"{name}.profile.json"
    overrides = [*common, f"training.train_iters={iters}", f"watcher.enabled={str(enabled).lower()}",
                 *(WARM if enabled and snapshots else [])]
    run = Launch(run_dir, overrides, argv=[sys.executable, __file__, "--drive", str(profile)]).start()
    cpu = steady_cpu_per_step(run, iters)
    code = run.wait(timeout=600)
    if code != 0:
        raise BenchError(f"{name}: driver exited {code}:\n{run.log_tail()}")
    figures = step_figures(run_dir)
    figures.update({f"cpu_{name}_ms": 1000 * seconds for name, seconds in cpu.items()})
    judged = json.loads(profile.read_text())
    figures["judge_cpu_ms_per_step"] = 1000 * judged["cpu_s"] / figures["steps"]
    figures["judge_wall_ms_per_step"] = 1000 * judged["wall_s"] / figures["steps"]
    figures["polls"] = judged["calls"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="pairs of runs (on/off, then off/on, ...)")
    parser.add_argument("--iters", type=int, default=150, help="training.train_iters of each run")
    parser.add_argument("--snapshots", action="store_true",
                        help="the 'on' arm also keeps warm state (checkpoint.memory_interval=1) and a ready spare")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="dp",
                        help="both arms' layout: dp (plain data parallel: no snapshot, the live state serves) or "
                             "zero1 (a snapshot every step, sent to the rank's buddy)")
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.drive:
        return drive(args.drive, rest)
    base = Path(tempfile.mkdtemp(prefix="watcher-overhead-"))
    print(f"demo, {args.iters} steps per run, {args.trials} pairs"
          + (", warm state and a ready spare" if args.snapshots else "") + f", layout {args.layout}"
          + f"; runs in {base}", flush=True)
    results: dict[bool, list[dict]] = {True: [], False: []}
    rows = []
    for trial in range(args.trials):
        # Alternate the order within pairs: the second run of a pair is often slower
        # (the first one's Ray processes are still exiting), which must not count
        # against one arm.
        for enabled in ((True, False) if trial % 2 == 0 else (False, True)):
            name = f"t{trial}-{'on' if enabled else 'off'}"
            figures = one_run(base, name, enabled, args.iters, args.snapshots, LAYOUTS[args.layout])
            results[enabled].append(figures)
            rows.append([trial, "on" if enabled else "off", 1000 * figures["step_time"], 1000 * figures["interval"],
                         figures["span"], figures["steady_span"], *(figures[f"cpu_{r}_ms"] for r in ROLES),
                         figures["polls"], figures["judge_cpu_ms_per_step"]])
            print(f"  {name}: step_time {1000 * figures['step_time']:.1f} ms", flush=True)
    print_table(["trial", "watcher", "step_ms", "interval_ms", "span_s", "steady_span_s",
                 *(f"cpu_{r}_ms/step" for r in ROLES), "polls", "judge_cpu_ms/step"], rows)
    med = {on: {key: median([r[key] for r in results[on]]) for key in results[on][0]} for on in (True, False)}
    paired = sorted(on["interval"] / off["interval"] for on, off in zip(results[True], results[False]))
    arm = "watcher and snapshots" if args.snapshots else "watcher"
    print(f"ratio with/without {arm}: step_time {med[True]['step_time'] / med[False]['step_time']:.3f}x, "
          f"interval {med[True]['interval'] / med[False]['interval']:.3f}x, "
          f"span {med[True]['span'] / med[False]['span']:.3f}x, "
          f"span from step {STEADY_FROM} {med[True]['steady_span'] / med[False]['steady_span']:.3f}x; "
          f"interval of each pair {paired[0]:.3f}x-{paired[-1]:.3f}x (median {median(paired):.3f}x): "
          f"the drift of this machine between runs; "
          f"driver CPU in the watcher+policy {med[True]['judge_cpu_ms_per_step']:.3f} ms/step")
    if args.snapshots:
        account(med, args.layout)
    return 0


def account(med: dict, layout: str) -> None:
    """What the watcher, the warm state and the spare cost a step, part by part, by each role's
    own CPU, where drift cannot reach them. On a machine whose cores the ranks fill (this one:
    two ranks, two cores), CPU taken by another process is time a rank loses; on a cluster the
    driver and a spare run beside the ranks. The ranks' own CPU per step is set against the
    same figure without: the warm state's cost inside a rank."""
    extra = {r: med[True][f"cpu_{r}_ms"] - med[False][f"cpu_{r}_ms"] for r in ROLES}
    step_ms = 1000 * med[False]["interval"]
    print("CPU per step with/without, medians: " + ", ".join(
        f"{r} {med[True][f'cpu_{r}_ms']:.2f}/{med[False][f'cpu_{r}_ms']:.2f} ms ({extra[r]:+.2f})" for r in ROLES))
    watcher = extra["driver"] + extra["agent"] + extra["ray"]
    where = "no snapshot in plain data parallel" if layout == "dp" else "the snapshots: in the ranks' CPU below"
    print(f"accounted overhead per step of a {step_ms:.1f} ms step: watcher and warm state (driver "
          f"{extra['driver']:+.2f} ms + node agent {extra['agent']:+.2f} ms + Ray {extra['ray']:+.2f} ms, {where}) "
          f"= {watcher:+.2f} ms, {100 * watcher / step_ms:.2f}%; the ready spare waiting on this machine's "
          f"cores {extra['spare']:+.2f} ms more: {100 * (watcher + extra['spare']) / step_ms:.2f}% in all; "
          f"the ranks' own CPU {extra['ranks']:+.2f} ms ({100 * extra['ranks'] / (2 * step_ms):+.2f}% of two ranks)")


if __name__ == "__main__":
    sys.exit(main())
