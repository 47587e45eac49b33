"""The watcher's cost: step time of the same demo run with the watcher on and off.

    .venv/bin/python bench/watcher_overhead.py [--trials N] [--iters 150] [--snapshots]

With ``--snapshots`` the "on" arm also keeps the warm path's state: a memory
snapshot every step (``checkpoint.memory_interval=1``, a host copy of the
model, AdamW's moments and the loss scaler) and one ready spare
(``controller.warm_spares=1``); the "off" arm has neither. The snapshot is
taken between steps, so its cost shows in the interval between step rows and
in the span, not in the trainer's own step_time.

Each trial runs the demo twice, watcher on then off (on, off, on, off, ...:
interleaved so that the load of this shared machine drifts into both arms
alike), same seed, same steps. ``watcher.enabled=false`` turns every detector
off (runmgr/controller/judge.py); worker deaths would still be judged.

Per run it reports, from ``runmgr logbook metrics RUN --json``: the median
step_time the trainer measured, the median wall interval between consecutive
step rows, and the training span (first to last step row). The watcher runs
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

from runs import BenchError, Launch, logbook_rows, median, print_table  # noqa: E402


def drive(profile_path: Path, overrides: list[str]) -> int:
    """Child mode: launch the demo in this process, timing every Judge.judge call."""
    from runmgr.controller.judge import Judge
    from runmgr.launch import launch

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
    code = launch("demo", overrides)
    profile_path.write_text(json.dumps(totals))
    return code


def step_figures(run_dir: Path) -> dict:
    rows = logbook_rows(run_dir, "metrics")
    if not rows:
        raise BenchError(f"no step rows in {run_dir}")
    times = [row["time"] for row in rows]
    return {
        "steps": len(rows),
        "step_time": median([row["step_time"] for row in rows]),
        "interval": median([b - a for a, b in zip(times, times[1:])]),
        "span": times[-1] - times[0],
    }


WARM = ["controller.warm_spares=1", "checkpoint.memory_interval=1"]


def one_run(base: Path, name: str, enabled: bool, iters: int, snapshots: bool = False) -> dict:
    run_dir = base / name
    profile = base / f"{name}.profile.json"
    overrides = [f"training.train_iters={iters}", f"watcher.enabled={str(enabled).lower()}",
                 *(WARM if enabled and snapshots else [])]
    run = Launch(run_dir, overrides, argv=[sys.executable, __file__, "--drive", str(profile)]).start()
    code = run.wait(timeout=600)
    if code != 0:
        raise BenchError(f"{name}: driver exited {code}:\n{run.log_tail()}")
    figures = step_figures(run_dir)
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
                        help="the 'on' arm also takes a memory snapshot every step and keeps a ready spare")
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.drive:
        return drive(args.drive, rest)
    base = Path(tempfile.mkdtemp(prefix="watcher-overhead-"))
    print(f"demo, {args.iters} steps per run, {args.trials} pairs; runs in {base}", flush=True)
    results: dict[bool, list[dict]] = {True: [], False: []}
    rows = []
    for trial in range(args.trials):
        # Alternate the order within pairs: the second run of a pair is often slower
        # (the first one's Ray processes are still exiting), which must not count
        # against one arm.
        for enabled in ((True, False) if trial % 2 == 0 else (False, True)):
            name = f"t{trial}-{'on' if enabled else 'off'}"
            figures = one_run(base, name, enabled, args.iters, args.snapshots)
            results[enabled].append(figures)
            rows.append([trial, "on" if enabled else "off", figures["steps"], 1000 * figures["step_time"],
                         1000 * figures["interval"], figures["span"], figures["polls"],
                         figures["judge_cpu_ms_per_step"], figures["judge_wall_ms_per_step"]])
            print(f"  {name}: step_time {1000 * figures['step_time']:.1f} ms", flush=True)
    headers = ["trial", "watcher", "steps", "step_ms", "interval_ms", "span_s", "polls",
               "judge_cpu_ms/step", "judge_wall_ms/step"]
    print_table(headers, rows)
    med = {on: {key: median([r[key] for r in results[on]]) for key in results[on][0]} for on in (True, False)}
    print_table(["watcher", "median step_ms", "median interval_ms", "median span_s", "judge_cpu_ms/step"],
                [[("on" if on else "off"), 1000 * med[on]["step_time"], 1000 * med[on]["interval"],
                  med[on]["span"], med[on]["judge_cpu_ms_per_step"]] for on in (True, False)])
    arm = "watcher and snapshots" if args.snapshots else "watcher"
    print(f"ratio with/without {arm}: step_time {med[True]['step_time'] / med[False]['step_time']:.3f}x, "
          f"interval {med[True]['interval'] / med[False]['interval']:.3f}x, "
          f"span {med[True]['span'] / med[False]['span']:.3f}x; "
          f"driver CPU in the watcher+policy {med[True]['judge_cpu_ms_per_step']:.3f} ms/step "
          f"({100 * med[True]['judge_cpu_ms_per_step'] / (1000 * med[True]['interval']):.2f}% of a step interval)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
