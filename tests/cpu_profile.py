"""The CPU each test costs, with every process it started: a pytest plugin, off unless asked for.

The suite is CPU-bound on CI's 2 cores (docs/testing.md), and its cost is spent mostly in
processes a test starts (Ray's daemons, rank actors, torchruns, CLI runs) that outlive or
escape ``getrusage``: Ray's workers are the raylet's children, not the test's. So each
pytest(-xdist) worker moves itself into a cgroup of its own, everything it starts inherits
it, and the cgroup's CPU counter is read before and after each test::

    PYTEST_ADDOPTS="-p tests.cpu_profile" CPU_PROFILE=/tmp/suite-cpu.jsonl make test
    .venv/bin/python -m tests.cpu_profile /tmp/suite-cpu.jsonl      # per module, costliest first

Needs a writable cgroup hierarchy (root): cgroup v1's ``cpuacct`` or cgroup v2. A session
Ray started by one test's fixture is counted to whichever test of that worker uses it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional

import pytest

OUTPUT_VARIABLE = "CPU_PROFILE"
"""Where the per-test lines go (JSON lines, appended): the plugin does nothing without it."""
V1_ROOT = Path("/sys/fs/cgroup/cpuacct")
V2_ROOT = Path("/sys/fs/cgroup")


class CpuCounter:
    """A cgroup this process moved into, and the CPU-seconds spent in it so far."""

    def __init__(self, name: str) -> None:
        if V1_ROOT.is_dir():
            self.root, self._usage, self._members = V1_ROOT, self._v1_usage, "tasks"
        elif (V2_ROOT / "cgroup.controllers").exists():
            self.root, self._usage, self._members = V2_ROOT, self._v2_usage, "cgroup.procs"
        else:
            raise pytest.UsageError("tests.cpu_profile needs a cgroup hierarchy (cgroup v1 cpuacct or v2)")
        self.path = self.root / name
        try:
            self.path.mkdir(exist_ok=True)
            (self.path / self._members).write_text(str(os.getpid()))
        except OSError as error:
            raise pytest.UsageError(f"tests.cpu_profile cannot use the cgroup {self.path} ({error.strerror}): "
                                    f"run the tests as root") from None

    def seconds(self) -> float:
        return self._usage()

    def leave(self) -> None:
        """Back to the root group, and the group removed unless a process started in it still runs."""
        (self.root / self._members).write_text(str(os.getpid()))
        try:
            self.path.rmdir()
        except OSError:  # EBUSY: a process it started outlived the session; its (empty) group stays behind
            pass

    def _v1_usage(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def _v2_usage(self) -> float:
        fields = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(fields["usage_usec"]) / 1e6


class CpuProfile:
    """Appends ``{"id", "cpu", "wall", "worker", "start"}`` per test to the output file (``start``:
    the test's wall-clock start, epoch seconds, so that two workers' tests line up on one
    timeline and the stretches where both only wait show)."""

    def __init__(self, output: Path, worker: str) -> None:
        self.output = output
        self.worker = worker
        self.counter = CpuCounter(f"runmgr-tests-{worker}-{os.getpid()}")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]):
        cpu, wall, start = self.counter.seconds(), time.monotonic(), time.time()
        yield
        line = {"id": item.nodeid, "cpu": round(self.counter.seconds() - cpu, 2),
                "wall": round(time.monotonic() - wall, 2), "worker": self.worker, "start": round(start, 2)}
        with open(self.output, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.counter.leave()


def pytest_configure(config: pytest.Config) -> None:
    output = os.environ.get(OUTPUT_VARIABLE)
    if not output:
        raise pytest.UsageError(f"tests.cpu_profile: set {OUTPUT_VARIABLE}=FILE, where the per-test lines go")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    config.pluginmanager.register(CpuProfile(Path(output), worker), "runmgr_cpu_profile")


def summary(lines: list[dict], top: int = 40) -> str:
    """Per module: CPU-seconds, wall seconds, tests; costliest first, with the totals and each
    worker's share."""
    cpu, wall, count = defaultdict(float), defaultdict(float), defaultdict(int)
    workers = defaultdict(lambda: [0.0, 0.0])
    for line in lines:
        module = line["id"].split("::")[0]
        cpu[module] += line["cpu"]
        wall[module] += line["wall"]
        count[module] += 1
        workers[line["worker"]][0] += line["cpu"]
        workers[line["worker"]][1] += line["wall"]
    rows = [f"{'cpu_s':>8} {'wall_s':>8} {'tests':>5}  module"]
    rows += [f"{cpu[m]:8.1f} {wall[m]:8.1f} {count[m]:5d}  {m}" for m in sorted(cpu, key=cpu.get, reverse=True)[:top]]
    rows.append(f"{sum(cpu.values()):8.1f} {sum(wall.values()):8.1f} {sum(count.values()):5d}  all "
                f"({len(cpu)} modules)")
    rows += [f"  worker {name}: {c:.0f} CPU-s in {w:.0f} s of tests" for name, (c, w) in sorted(workers.items())]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python -m tests.cpu_profile FILE (the JSON lines a profiled run wrote)", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as lines:
        print(summary([json.loads(line) for line in lines if line.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
