"""How soon shadow mode calls what it reads: a live log written by another process, followed.

    .venv/bin/python bench/follow_latency.py [--trials N] [--speed 300] [--poll-interval 0.2]

Each trial starts a real `runmgr watch follow FILE` process (conf=shadow, a learned step timeout
floor of 2 s: watcher.hang.step.min_s=2), then `runmgr watch play` writing
tests/data/live/megatron_spikes_and_hang.log into FILE at ``--speed`` times its pace (a
recovering spike at 150, a persistent one from 300, nothing after 360). A thread of this
script reads FILE every 5 ms and notes when each iteration's line appeared. From the logbook:

- spike: seconds from iteration 350's line (the end of the persistent spike's 50-step grace, the
  line that decides it) appearing to the incident's record;
- hang: seconds from iteration 360's line to the hang's record, against the timeout the incident
  says it learned.

Prints a row per trial, the medians, and the ratios: spike latency / poll interval, hang
detection / learned timeout.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from logbook import Logbook  # noqa: E402 (the repository on the path first)

LIVE_LOG = ROOT / "tests" / "data" / "live" / "megatron_spikes_and_hang.log"
ITERATION = re.compile(r"\] iteration +(\d+)/")


class Written:
    """When each iteration's line first appeared in the log file, as a reader polling it every
    5 ms saw it (the writer is another process)."""

    def __init__(self, path: Path) -> None:
        self.path, self.at = path, {}
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self.done.is_set():
            if self.path.exists():
                for iteration in ITERATION.findall(self.path.read_text()):
                    self.at.setdefault(int(iteration), time.time())
            time.sleep(0.005)

    def close(self) -> None:
        self.done.set()
        self._thread.join()


def trial(workdir: Path, speed: float, poll_s: float) -> dict:
    log, run_dir = workdir / "train.log", workdir / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runmgr = [sys.executable, "-m", "runmgr", "watch"]
    follower = subprocess.Popen([*runmgr, "follow", str(log), "conf=shadow", f"run.dir={run_dir}",
                                 "watcher.hang.step.min_s=2", "--poll-interval", str(poll_s)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    written = Written(log)
    try:
        follower.stdout.readline()  # following
        subprocess.run([*runmgr, "play", str(LIVE_LOG), str(log), "--speed", str(speed)], env=env, check=True)
        for line in follower.stdout:
            if "hang at step 360" in line:
                break
    finally:
        written.close()
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=60)
    with Logbook.open(run_dir, create=False) as book:
        found = {(e["kind"], e["step"]): e for e in book.events() if e["type"] == "incident"}
    spike, hang = found[("loss_spike", 300)], found[("hang", 360)]
    timeout_s = float(hang["evidence"]["description"].split("timeout ")[1].split(" s")[0])
    return {"spike_s": spike["time"] - written.at[350], "hang_s": hang["time"] - written.at[360],
            "timeout_s": timeout_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--speed", type=float, default=300.0)
    parser.add_argument("--poll-interval", type=float, default=0.2)
    args = parser.parse_args()
    rows = []
    print(f"{'trial':>5}  {'spike s':>8}  {'hang s':>7}  {'learned timeout s':>17}")
    for number in range(1, args.trials + 1):
        with tempfile.TemporaryDirectory(prefix="follow_latency-") as scratch:
            row = trial(Path(scratch), args.speed, args.poll_interval)
        rows.append(row)
        print(f"{number:>5}  {row['spike_s']:8.3f}  {row['hang_s']:7.3f}  {row['timeout_s']:17.1f}")
    spike = statistics.median(r["spike_s"] for r in rows)
    hang = statistics.median(r["hang_s"] for r in rows)
    timeout = statistics.median(r["timeout_s"] for r in rows)
    print(f"median: spike {spike:.3f} s after its deciding line was written; hang {hang:.3f} s after the last "
          f"line, learned timeout {timeout:.1f} s")
    print(f"ratio spike latency / poll interval: {spike / args.poll_interval:.2f}")
    print(f"ratio hang detection / learned timeout: {hang / timeout:.2f}")


if __name__ == "__main__":
    main()
