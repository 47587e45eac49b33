"""How much chaos's slow_rank really slows a rank against its peer, idle and beside busy
loops: the SIGSTOP/SIGCONT duty cycle alone, the lower priority alone, and both (what
runmgr/chaos/procfault.duty_cycle does), measured side by side in one run.

    .venv/bin/python bench/straggler_slowing.py [--factor 3] [--seconds 12] [--busy 0,2]

Two processes each time one fixed chunk of pure-Python work over and over (a rank and its
peer); the helper slows the second. The ratio is the slowed one's median chunk time over the
peer's: a factor-3 straggler should read about 3 at any load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runmgr.chaos import procfault  # noqa: E402

WORKER = r'''
import sys, time
def chunk():
    total = 0
    for i in range(200000):
        total += i * i
    return total
end = time.time() + float(sys.argv[2])
with open(sys.argv[1], "w") as out:
    while time.time() < end:
        started = time.perf_counter(); chunk(); out.write(f"{time.perf_counter() - started}\n"); out.flush()
'''
MODES = {"duty cycle only": (True, False), "lower priority only": (False, True), "both (slow_rank)": (True, True)}


def one_trial(directory: Path, busy: int, duty: bool, lower: bool, factor: float, seconds: float) -> float:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        files = [directory / f"rank{i}.txt" for i in range(2)]
        ranks = [subprocess.Popen([sys.executable, "-c", WORKER, str(f), str(seconds)]) for f in files]
        time.sleep(1.0)  # both interpreters started
        cycle = None
        if duty:  # in a thread here: the helper slow_rank starts runs the same function
            cycle = threading.Thread(target=procfault.duty_cycle, args=(ranks[1].pid, factor, 0.02, seconds),
                                     kwargs={"lower": lower})
            cycle.start()
        elif lower:
            procfault.lower_priority(ranks[1].pid, procfault.nice_steps(factor))
        for rank in ranks:
            rank.wait()
        if cycle is not None:
            cycle.join()
        medians = [statistics.median(float(x) for x in f.read_text().split()[5:]) for f in files]
        return medians[1] / medians[0]
    finally:
        for hog in hogs:
            hog.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--busy", default="0,2", help="busy loops beside the two, comma-separated")
    args = parser.parse_args()
    loads = [int(n) for n in args.busy.split(",")]
    print(f"slowed rank's median chunk time over its peer's, a {args.factor:g}x slow_rank "
          f"(nice +{procfault.nice_steps(args.factor)}), {os.cpu_count()} cores")
    print(f"{'mode':22s}" + "".join(f"{f'{n} busy loops':>16s}" for n in loads))
    with tempfile.TemporaryDirectory() as directory:
        for mode, (duty, lower) in MODES.items():
            ratios = [one_trial(Path(directory), n, duty, lower, args.factor, args.seconds) for n in loads]
            print(f"{mode:22s}" + "".join(f"{r:15.2f}x" for r in ratios), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
