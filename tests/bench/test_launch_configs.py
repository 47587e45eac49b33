"""Every benchmark's run composes: the benchmarks launch the demo with their own
overrides, and a change to the demo (its chaos schedule, say) must not break them
silently. The configs are loaded exactly as each benchmark's driver loads them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        yield {name: importlib.import_module(name) for name in ("runs", "restart_latency", "hang_latency")}
    finally:
        sys.path.remove(str(BENCH))


def launched_overrides(runs, run_dir: Path, overrides: list[str], argv: list[str] | None = None) -> list[str]:
    """The key=value arguments a benchmark's `Launch` passes to `runmgr launch conf=demo`
    (or, with ``argv``, to the script that launches the demo in its own process)."""
    args = runs.Launch(run_dir, overrides, argv=argv).args
    return args[len(argv):] if argv else args[args.index(runs.DEMO) + 1:]


@pytest.mark.parametrize("case", ["restart_latency", "restart_warm", "restart_warm_zero1", "hang_latency",
                                  "watcher_on", "watcher_off"])
def test_each_benchmark_run_composes_without_the_demo_chaos(bench_modules, tmp_path, case):
    runs = bench_modules["runs"]
    overrides = {
        "restart_latency": bench_modules["restart_latency"].overrides(40),
        "restart_warm": [*bench_modules["restart_latency"].overrides(40), *bench_modules["restart_latency"].WARM],
        "restart_warm_zero1": [*bench_modules["restart_latency"].overrides(40),
                               *bench_modules["restart_latency"].WARM_ZERO1],
        "hang_latency": list(bench_modules["hang_latency"].OVERRIDES),
        "watcher_on": ["training.train_iters=150", "watcher.enabled=true"],
        "watcher_off": ["training.train_iters=150", "watcher.enabled=false"],
    }[case]
    # watcher_overhead.py launches the demo inside a script of its own (to time the judge).
    argv = ["python", "bench/watcher_overhead.py", "--drive", "profile.json"] if case.startswith("watcher") else None
    config = load_run_config("demo", launched_overrides(runs, tmp_path / "run", overrides, argv))
    assert config.chaos.faults == []  # each benchmark injects its own fault
