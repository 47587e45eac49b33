"""What a whole launch costs in CPU: the built-in trainer's ranks forked by node agents against
one Ray actor per rank, the same launch side by side in one run.

    .venv/bin/python bench/launch_cpu.py [--kills 4] [--nodes 1] [--repeat 1]

Each launch is the e2e tests' small run (tests/e2e/harness.py: 2 ranks, a checkpoint every 10
steps) on a local Ray of its own, with ``--kills`` workers killed by chaos on the way (one more
sub-run each, 50 steps apart). It runs in a cgroup of its own, so that every process it starts is counted:
the driver, Ray's daemons and workers (the raylet's children), the agents, their fork servers
and the ranks. The per-rank design is the launch with ``runmgr.runners.ranks_under_agents``
answering no (runmgr/runners.py ``per_rank_runner``: no launch runs it any more, warm spares
included; it is kept for this comparison, cold only). Needs root (a cgroup).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import E2E_OVERRIDES  # noqa: E402

CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/cpuacct")
LAUNCH = """
import sys
import runmgr.runners
if sys.argv[1] == "actors":
    runmgr.runners.ranks_under_agents = lambda config, device_kind: False
from runmgr.cli import main
sys.exit(main(sys.argv[2:]))
"""


def cgroup_cpu_seconds(group: Path) -> float:
    if (group / "cpu.stat").exists():
        fields = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
        return int(fields["usage_usec"]) / 1e6
    return int((group / "cpuacct.usage").read_text()) / 1e9


def new_cgroup(name: str) -> tuple[Path, str]:
    """A cgroup for one launch, and the file a process joins it through."""
    if CGROUP_V1.is_dir():
        root, members = CGROUP_V1, "tasks"
    elif (CGROUP_V2 / "cgroup.controllers").exists():
        root, members = CGROUP_V2, "cgroup.procs"
    else:
        raise SystemExit("bench/launch_cpu.py needs a cgroup hierarchy (cgroup v1 cpuacct or v2)")
    group = root / name
    try:
        group.mkdir(exist_ok=True)
    except OSError as error:
        raise SystemExit(f"bench/launch_cpu.py cannot make the cgroup {group} ({error.strerror}): run it as root")
    return group, members


def launch(design: str, run_dir: Path, kills: int, nodes: int) -> tuple[float, float, int, str]:
    """CPU-seconds, wall seconds, the exit code and the last line of one launch."""
    # One kill in each of the first ``kills`` sub-runs, 50 steps apart, long before the run's end: the
    # small model trains tens of steps a second, and a kill due after its sub-run ended is not made.
    faults = ", ".join(f"{{kind: kill_worker, at_step: {50 * (index + 1)}, rank: 1, at_subrun: {index}}}"
                       for index in range(kills))
    argv = ["launch", "conf=demo", f"run.dir={run_dir}", f"run.name={run_dir.name}", *E2E_OVERRIDES,
            f"training.train_iters={50 * (kills + 2)}", f"cluster.local_nodes={nodes}", f"chaos.faults=[{faults}]"]
    group, members = new_cgroup(f"runmgr-bench-{design}-{os.getpid()}-{run_dir.name}")
    before, started = cgroup_cpu_seconds(group), time.monotonic()

    def join_group() -> None:
        (group / members).write_text(str(os.getpid()))

    out = subprocess.run([sys.executable, "-c", LAUNCH, design, *argv], cwd=ROOT, capture_output=True, text=True,
                         preexec_fn=join_group, timeout=1200)
    time.sleep(2)  # Ray's daemons end just after the driver: their last CPU is counted
    cpu, wall = cgroup_cpu_seconds(group) - before, time.monotonic() - started
    try:
        group.rmdir()
    except OSError:
        pass  # a process of it still runs: the group stays behind, empty once it ends
    last = "\n".join((out.stdout + out.stderr).strip().splitlines()[-8:])
    return cpu, wall, out.returncode, last


def subruns(run_dir: Path) -> int:
    out = subprocess.run([sys.executable, "-m", "runmgr", "logbook", "events", str(run_dir), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return out.stdout.count('"type": "subrun_start"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=4, help="workers killed on the way (a sub-run each)")
    parser.add_argument("--nodes", type=int, default=1, help="local Ray nodes the two ranks spread over")
    parser.add_argument("--repeat", type=int, default=1, help="launches of each design, alternated")
    args = parser.parse_args()
    results: dict[str, list[float]] = {"actors": [], "agents": []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.repeat):
            for design in ("actors", "agents"):
                run_dir = Path(tmp) / f"{design}{index}"
                cpu, wall, code, last = launch(design, run_dir, args.kills, args.nodes)
                if code != 0:
                    raise SystemExit(f"the {design} launch exited {code}: {last}")
                count = subruns(run_dir)
                results[design].append(cpu / count)
                print(f"{design:>6}: {cpu:6.1f} CPU-s, {wall:5.1f} s, {count} sub-runs: {cpu / count:5.1f} CPU-s "
                      f"per sub-run", flush=True)
    actors, agents = (sum(results[d]) / len(results[d]) for d in ("actors", "agents"))
    print(f"2 ranks on {args.nodes} node(s), {args.kills} kills: per sub-run, one actor per rank {actors:.1f} CPU-s, "
          f"node agents {agents:.1f} CPU-s: {actors / agents:.2f}x")


if __name__ == "__main__":
    main()
