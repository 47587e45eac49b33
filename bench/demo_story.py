"""The demo told N times in a row: does it tell the same story every time (issue 32 item 3)?

Runs the demo as `make demo` does (`runmgr launch conf=demo`, its health check and its own local
Ray of 3 nodes, chaos=opt_run12), one run after the other, and compares their logbooks: the
sub-runs with the step each started from, each incident's kind with its onset step (where it has
one), and each decision's action. Prints each run's story, where two runs differ, and one line
``same story: N of N`` (exit 0 when every run tells the first one's story, 1 otherwise)::

    .venv/bin/python bench/demo_story.py [--runs 3] [--out /tmp/demo-story] [key=value ...]

A run takes about 2-3 minutes on an idle 2-core machine. Extra ``key=value`` items go to every
launch (e.g. ``health.skip=true`` as tests/e2e/test_closed_loop.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from logbook.story import story_lines, story_of  # noqa: E402


def runmgr(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "runmgr", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def tell(run_dir: Path, extra: list[str]) -> tuple[int, float, list[str]]:
    """One demo run into ``run_dir``: its exit code, its seconds and its story's lines."""
    started = time.monotonic()
    launched = runmgr("launch", "conf=demo", f"run.name={run_dir.name}", f"run.dir={run_dir}", *extra)
    seconds = time.monotonic() - started
    (run_dir.parent / f"{run_dir.name}.log").write_text(launched.stdout + launched.stderr)
    events = runmgr("logbook", "events", str(run_dir), "--json", timeout=120)
    if events.returncode != 0:
        return launched.returncode, seconds, [f"(no logbook: {events.stderr.strip()})"]
    rows = [json.loads(line) for line in events.stdout.splitlines() if line.strip()]
    lines = story_lines(story_of(rows))
    # Kept beside the run: tests/data/demo_story holds three of them, which every run of the
    # closed loop's demo (tests/e2e/test_closed_loop.py) is compared with.
    (run_dir.parent / f"{run_dir.name}.story.txt").write_text("\n".join(lines) + "\n")
    return launched.returncode, seconds, lines


def first_difference(a: list[str], b: list[str]) -> str:
    for index, (left, right) in enumerate(zip(a, b)):
        if left != right:
            return f"line {index + 1}: {left!r} against {right!r}"
    return f"{len(a)} lines against {len(b)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/demo-story"))
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stories = []
    for index in range(args.runs):
        run_dir = args.out / f"demo-{stamp}-{index + 1}"
        code, seconds, lines = tell(run_dir, args.overrides)
        stories.append(lines)
        print(f"run {index + 1}: exit {code}, {seconds:.0f} s, {run_dir}")
        for line in lines:
            print(f"  {line}")
        sys.stdout.flush()
    same = sum(1 for lines in stories if lines == stories[0])
    for index, lines in enumerate(stories[1:], start=2):
        if lines != stories[0]:
            print(f"run {index} differs from run 1 at {first_difference(stories[0], lines)}")
    print(f"same story: {same} of {len(stories)}")
    return 0 if same == len(stories) else 1


if __name__ == "__main__":
    sys.exit(main())
