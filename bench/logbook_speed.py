"""How fast the logbook's views answer on OPT-175B-sized history.

    .venv/bin/python bench/logbook_speed.py [--steps 150000] [--subruns 60] [--runs 100] [--repeat 3]

Builds, in a temporary folder and through the real Logbook API (metrics
recorded in batches as the driver does), ``--runs`` small runs (3 sub-runs,
300 steps each) and one big run of ``--steps`` kept steps over ``--subruns``
sub-runs, each ended by an incident and its decision (rollbacks throw steps
away, so the big run holds more rows than steps). Then it times, side by
side in this one invocation, each view a person waits for:

    list         `runmgr logbook list FOLDER` on the small runs
    show         `runmgr logbook show RUN` (text chronicle) on the big run
    show_json    `runmgr logbook show RUN --json`
    curves       logbook.curves.curves for loss, grad_norm, lr, loss_scale
    plot         `runmgr logbook plot RUN` (the PNG of those four metrics)
    page         `runmgr logbook serve`: the run's page and its curve, fetched over HTTP
                 from the real server on 127.0.0.1
    page_list    the same server's list of the small runs

and prints the median of ``--repeat`` timings per view, in seconds. More
views join through :data:`TIMED` (name -> callable taking the
:class:`Built` folders).
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from logbook import Logbook  # noqa: E402
from logbook import cli as logbook_cli  # noqa: E402
from logbook.curves import curves  # noqa: E402
from logbook.plot import write_png  # noqa: E402
from logbook.web.app import make_app  # noqa: E402
from logbook.web.server import bind, make_server, url_of  # noqa: E402

BATCH = 1000
"""Rows per record_metrics call (the driver records a poll's steps at once)."""
STEP_TIME = 1.0
KINDS = ("loss_spike", "worker_death", "hang", "ecc_error", "nccl_error")
PLOTTED = ("loss", "grad_norm", "lr", "loss_scale")


@dataclass(frozen=True)
class Built:
    """What the timed views read."""

    runs_root: Path
    """The folder of small runs (``list``)."""
    big_run: Path
    """The run of many steps and sub-runs (``show``, ``curves``, ``plot``, the page)."""


class StepClock:
    """The logbook's clock, moved by the builder as training would."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def metric_row(step: int, at: float, lr_scale: float) -> dict:
    """A plausible step: a decaying loss with a rare spike, the rest smooth."""
    spike = 6.0 if step % 9973 == 0 else 0.0
    return {"step": step, "loss": 2.0 + 8.0 / math.sqrt(step + 1) + spike, "grad_norm": 0.3 + 0.1 * math.sin(step),
            "lr": 3e-4 * lr_scale, "loss_scale": 2.0 ** (16 - step % 4), "tokens": 2048 * 1024,
            "step_time": STEP_TIME, "time": at, "skipped": False}


def train(book: Logbook, clock: StepClock, subrun_id: str, first: int, last: int, lr_scale: float) -> None:
    """Record steps first..last in batches, the clock moving one step time per step."""
    for batch_start in range(first, last + 1, BATCH):
        rows = []
        for step in range(batch_start, min(last, batch_start + BATCH - 1) + 1):
            clock.now += STEP_TIME
            rows.append(metric_row(step, clock.now, lr_scale))
        book.record_metrics(subrun_id, rows)


def write_run(run_dir: Path, run_number: int, steps: int, subruns: int, lost_per_restart: int) -> None:
    """A lineage of ``subruns`` sub-runs reaching ``steps``: each but the last trains
    ``lost_per_restart`` steps past the checkpoint the next one resumes from."""
    clock = StepClock()
    span = steps // subruns
    config = {"run": {"name": run_dir.name, "number": run_number}, "optim": {"lr": 3e-4}}
    with Logbook.open(run_dir, clock=clock) as book:
        start, cause = 0, "launch"
        for index in range(subruns):
            subrun_id = book.next_subrun_id(run_number)
            checkpoint = None if start == 0 else f"checkpoints/step_{start:08d}"
            book.start_subrun(subrun_id, cause, {}, checkpoint, start, {"lr_scale": 1.0}, config)
            clock.now += 20.0  # workers start, the checkpoint loads
            last_kept = steps if index == subruns - 1 else start + span
            reached = last_kept if index == subruns - 1 else last_kept + lost_per_restart
            train(book, clock, subrun_id, start + 1, reached, 1.0)
            if index == subruns - 1:
                book.end_subrun(subrun_id, "finished", reached, None)
                break
            kind = KINDS[index % len(KINDS)]
            incident = book.record_incident(subrun_id, kind, f"{kind} at step {reached}", {"step": reached},
                                            step=reached)
            book.record_decision(subrun_id, incident, "restart", f"{kind}: resume from step {last_kept}", {})
            book.end_subrun(subrun_id, "restarting", reached, f"restart: {kind}")
            clock.now += 30.0  # down until the next start
            start, cause = last_kept, f"{kind} at step {reached}"


def build(root: Path, steps: int, subruns: int, runs: int) -> Built:
    """The small runs under ``root/runs`` and the big run ``root/big``."""
    runs_root = root / "runs"
    for number in range(runs):
        write_run(runs_root / f"run{number:03d}", number + 1, steps=300, subruns=3, lost_per_restart=20)
    write_run(root / "big", 12, steps=steps, subruns=subruns, lost_per_restart=500)
    return Built(runs_root, root / "big")


def _curves_of_plotted(built: Built) -> None:
    with Logbook.open(built.big_run, create=False) as book:
        for metric in PLOTTED:
            curves(book, metric)


def _plot(built: Built) -> None:
    with Logbook.open(built.big_run, create=False) as book:
        write_png(book, PLOTTED, built.big_run / "plots" / "bench.png")


class PageServer:
    """The page's real server (uvicorn on 127.0.0.1, a free port) over the bench's folder."""

    def __init__(self, root: Path) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.server = make_server(make_app(root))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        self.url = url_of(self.sock).rstrip("/")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=60) as answer:
            return answer.read()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def _page(server: PageServer, name: str) -> None:
    server.get(f"/run/{name}")
    server.get(f"/api/run/{name}/figure")  # what a browser fetches to draw the curves
    server.get(f"/api/run/{name}/curves")  # and on each live refresh


TIMED: dict[str, Callable[[Built], object]] = {
    "list": lambda built: logbook_cli.list_runs(built.runs_root, io.StringIO()),
    "show": lambda built: logbook_cli.show(built.big_run, io.StringIO()),
    "show_json": lambda built: logbook_cli.show(built.big_run, io.StringIO(), as_json=True),
    "curves": _curves_of_plotted,
    "plot": _plot,
}
"""Each view a person waits for, by name (the page's two are timed through its server, in main)."""


def time_views(built: Built, repeat: int) -> dict[str, float]:
    """The median of ``repeat`` wall timings of every view in :data:`TIMED`."""
    timings: dict[str, list[float]] = {name: [] for name in TIMED}
    for _ in range(repeat):
        for name, view in TIMED.items():  # interleaved: the machine's load drifts into every view alike
            began = time.perf_counter()
            view(built)
            timings[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) for name, values in timings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150_000, help="kept steps of the big run")
    parser.add_argument("--subruns", type=int, default=60, help="sub-runs of the big run")
    parser.add_argument("--runs", type=int, default=100, help="small runs in the folder `list` reads")
    parser.add_argument("--repeat", type=int, default=3, help="timings per view (the median is printed)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="logbook-speed-") as tmp:
        began = time.perf_counter()
        built = build(Path(tmp), args.steps, args.subruns, args.runs)
        print(f"built {args.runs} small runs and one of {args.steps} steps / {args.subruns} sub-runs "
              f"in {time.perf_counter() - began:.1f} s")
        big, small = PageServer(built.big_run.parent), PageServer(built.runs_root)
        try:
            TIMED["page"] = lambda built: _page(big, built.big_run.name)
            TIMED["page_list"] = lambda built: small.get("/")
            for name, seconds in time_views(built, args.repeat).items():
                print(f"{name:<10} {seconds:8.3f} s")
        finally:
            big.close()
            small.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
