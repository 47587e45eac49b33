"""The logbook and the metrics of a 54-day, 16,384-rank run at Llama 3's failure rates.

The ETTR simulator's run (runmgr/simulate/: the real controller, judge and policy over a
simulated clock and group; Llama 3's failures by class) is written by the real logbook writer
and metrics exporter, every step reported as rank 0 reports it. Then the commands a person
runs on it are timed: ``runmgr logbook show``, ``plot`` (PNG and HTML), ``export`` and the web
page of ``serve`` (its run page fetched over 127.0.0.1).

    .venv/bin/python bench/logbook_scale.py [--days 54] [--devices 16384] [--keep DIR]

It prints the logbook's size (per file, and per simulated hour), the sub-runs and incidents,
the Prometheus series the exporter serves, and each command's seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_run(run_dir: Path, days: float, devices: int, seed: int) -> dict:
    """The simulated run, logged; its figures."""
    from prometheus_client import CollectorRegistry

    from logbook import Logbook
    from runmgr.config.compose import config_as_dict, load_run_config
    from runmgr.metrics.exporter import MetricsObserver
    from runmgr.observers.logbook_writer import LogbookObserver
    from runmgr.simulate.assumptions import EttrAssumptions
    from runmgr.simulate.ettr import failures_for, simulate

    a = EttrAssumptions(devices=devices, days=days)
    config = load_run_config("demo", [f"run.dir={run_dir}", f"training.train_iters={a.train_steps}"])
    registry = CollectorRegistry()
    started = time.perf_counter()
    with Logbook.open(run_dir) as book:
        exporter = MetricsObserver(book, a.train_steps)
        registry.register(exporter)
        result = simulate(a, warm=False, failures=failures_for(a, seed),
                          observers=[LogbookObserver(book, config_as_dict(config)), exporter], every_step=True)
        series = sum(len(metric.samples) for metric in registry.collect())
    return {"seconds": time.perf_counter() - started, "steps": a.train_steps, "failures": result.failures,
            "wall_days": result.wall_s / 86400, "series": series}


def timed(args: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runmgr", *args], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return seconds, f"FAILED: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
    return seconds, done.stdout


def timed_page(run_dir: Path) -> tuple[float, int]:
    """Seconds from starting ``logbook serve`` to the run's page read, and the page's bytes."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "runmgr", "logbook", "serve", str(run_dir), "--port", "0"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().split(" at ")[1].split()[0]
        with urllib.request.urlopen(url, timeout=600) as answer:
            page = answer.read()
        return time.perf_counter() - started, len(page)
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--devices", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    args = parser.parse_args()
    run_dir = args.keep or Path(tempfile.mkdtemp(prefix="logbook-scale-")) / "run"
    run = write_run(run_dir, args.days, args.devices, args.seed)
    files = {p.relative_to(run_dir).as_posix(): p.stat().st_size for p in run_dir.rglob("*") if p.is_file()}
    total = sum(files.values())
    hours = args.days * 24
    print(f"{args.days:g} days, {args.devices} ranks, {run['steps']} steps, {run['failures']} failures "
          f"(Llama 3's rates), written in {run['seconds']:.0f} s; the run took {run['wall_days']:.1f} simulated days")
    print(f"logbook: {total / 1e6:.1f} MB ({total / hours / 1e3:.0f} KB per simulated hour of training); "
          + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sorted(files.items(), key=lambda f: -f[1])[:4]))
    print(f"metrics: {run['series']} Prometheus series")
    with tempfile.TemporaryDirectory() as out:
        for name, command in [("show", ["logbook", "show", str(run_dir)]),
                              ("plot png", ["logbook", "plot", str(run_dir), "--out", f"{out}/c.png"]),
                              ("plot html", ["logbook", "plot", str(run_dir), "--html", f"{out}/c.html"]),
                              ("export md", ["logbook", "export", str(run_dir), "--out", f"{out}/c.md"])]:
            seconds, output = timed(command)
            lines = output.count("\n")
            print(f"{name:>10}: {seconds:6.1f} s" + (f"  ({lines} lines)" if name == "show" else "")
                  + (f"  {output.strip()}" if output.startswith("FAILED") else ""), flush=True)
        seconds, size = timed_page(run_dir)
        print(f"{'web page':>10}: {seconds:6.1f} s  (serve started, the run's page read: {size / 1e3:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
