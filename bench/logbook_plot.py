"""How long ``runmgr logbook plot`` takes on a run of OPT-175B's length: builds a
logbook of STEPS kept steps over SUBRUNS sub-runs with the real Logbook API
(each sub-run rolls back a little and trains on; incidents of several kinds;
some restarts skip a data window), then times the PNG and the HTML.

    .venv/bin/python bench/logbook_plot.py [--steps 150000] [--subruns 60] [--dir /tmp/logbook-plot-bench]

Not a test: it prints seconds (median of --trials) and leaves the run for a look.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import time
from pathlib import Path

from logbook import Logbook
from logbook.plot import DEFAULT_METRICS, write_html, write_png, write_plots

BATCH = 16
KINDS = ("loss_spike", "worker_death", "hang", "nonfinite", "node_lost")


def build(run_dir: Path, steps: int, subruns: int, seed: int = 12) -> None:
    """A lineage of ``subruns`` sub-runs reaching step ``steps``."""
    rng = random.Random(seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    config = {"run": {"name": run_dir.name, "number": 12}}
    clock = [1_700_000_000.0]
    with Logbook.open(run_dir, clock=lambda: clock[0]) as book:
        start, skips = 0, []
        per = steps // subruns
        for index in range(subruns):
            subrun = f"12.{index:02d}"
            book.start_subrun(subrun, "launch" if index == 0 else "restart", {}, None, start,
                              {"skip_ranges": [list(r) for r in skips], "lr_scale": 1.0}, config)
            end = steps if index == subruns - 1 else min(steps, (index + 1) * per + rng.randint(50, 400))
            book.record_metrics(subrun, [_row(step, rng) for step in range(start + 1, end + 1)])
            clock[0] += (end - start) * 0.5
            if index < subruns - 1:
                kind = KINDS[index % len(KINDS)]
                book.record_incident(subrun, kind, f"{kind} at step {end - 3}", {"rank": index % 8}, step=end - 3)
                book.end_subrun(subrun, "restarting", end, kind)
                clock[0] += 300.0
                start = (index + 1) * per - rng.randint(0, 200)
                if kind == "loss_spike":
                    skips.append((BATCH * (end - 20), BATCH * (end - 5)))
            else:
                book.end_subrun(subrun, "finished", end, None)


def _row(step: int, rng: random.Random) -> dict:
    loss = 2.0 + 8.0 / math.sqrt(1.0 + step / 200.0) + rng.gauss(0, 0.03)
    if rng.random() < 2e-4:
        loss += rng.uniform(1.0, 4.0)
    return {"step": step, "loss": loss, "grad_norm": abs(rng.lognormvariate(-1.0, 0.4)),
            "lr": 3e-4 * min(1.0, step / 2000.0) * (0.1 + 0.9 * (1 - step / 160_000)),
            "loss_scale": 2.0 ** (16 - (step // 9000) % 4), "step_time": 0.5, "tokens": 4096 * BATCH,
            "consumed_samples": BATCH * step}


def timed(fn, trials: int) -> float:
    seconds = []
    for _ in range(trials):
        began = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--subruns", type=int, default=60)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/logbook-plot-bench/opt12"))
    args = parser.parse_args()
    began = time.perf_counter()
    build(args.dir, args.steps, args.subruns)
    print(f"built {args.dir}: {args.steps} steps, {args.subruns} sub-runs in {time.perf_counter() - began:.1f} s")
    out = args.dir / "plots"
    with Logbook.open(args.dir, create=False) as book:
        png = timed(lambda: write_png(book, DEFAULT_METRICS, out / "bench.png"), args.trials)
        html = timed(lambda: write_html(book, DEFAULT_METRICS, out / "bench.html"), args.trials)
        both = timed(lambda: write_plots(book, DEFAULT_METRICS, out / "both.png", out / "both.html"), args.trials)
    print(f"png {png:.2f} s   html {html:.2f} s   png+html {both:.2f} s   (median of {args.trials}; "
          f"{len(DEFAULT_METRICS)} metrics) -> {out}")


if __name__ == "__main__":
    main()
