"""The health check at fleet scale: the real fleet check (runmgr/healthcheck/fleet_run.py)
over thousands of simulated nodes (runmgr/scale/fleet.py), some of them planted bad
(1% slow: half in compute, half in their network; 0.5% with an uncorrectable ECC error;
0.5% whose HPFS mount failed).

    .venv/bin/python bench/health_scale.py [--sizes 256,2048,16384]

Per size: the seconds from the first node's report to the verdicts (the driver's work: the
parsers, the peer comparison, the pairing and blame of the collective tests; the probes'
own time on a real node, about a minute in parallel, is not in it), the collective tests'
rounds and groups against the all-pairs count, and the planted nodes found, missed, and the
healthy ones excluded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runmgr.scale.fleet import PlantedFleet, check_simulated_fleet  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,2048,16384")
    args = parser.parse_args()
    print("  nodes  verdicts_s  rounds  groups(all pairs)   planted  found  missed  healthy_excluded")
    for nodes in [int(x) for x in args.sizes.split(",")]:
        fleet = PlantedFleet(nodes)
        started = time.perf_counter()
        check, probes = check_simulated_fleet(fleet, lambda line: None)
        seconds = time.perf_counter() - started
        bad, excluded = fleet.bad(), set(check.excluded)
        outcome = check.collectives
        rounds = 1 + (1 if outcome.second else 0)
        candidates = len({node for group in outcome.first for node in group})  # in the collective tests
        pairs = len(outcome.first) + len(outcome.second)
        print(f"{nodes:>7} {seconds:>11.2f} {rounds:>7} {pairs:>7}({candidates * (candidates - 1) // 2:>9}) "
              f"{len(bad):>9} {len(bad & excluded):>6} {len(bad - excluded):>7} {len(excluded - bad):>17}",
              flush=True)
        kinds = ", ".join(f"{len(v)} {k}" for k, v in probes.planted.items())
        print(f"{'':>7} planted: {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
