"""One rank of a multi-process trainer test, run as a script by conftest's
``launch_ranks``: reads a JSON spec (config dict, plan dict), trains with the
real trainer, appends every report to ``<out>/rank<R>.events`` as it happens
(so a test can watch progress and inject a fault), and writes the result to
``<out>/rank<R>.json``. Rank, world size and rendezvous come from the
environment, as under torchrun. With ``"own_peak": true`` in the spec, the rank first
resets its peak resident set to what it holds now: a rank forked from the fork server
then reports its own peak, not the server's, as a new Python would."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from trainer.cli import config_from_dict
from trainer.distributed import DistEnv
from trainer.loop import train
from trainer.plan import ResumePlan


class FileReporter:
    """Appends one JSON line per report and flushes, so progress is visible live."""

    def __init__(self, path: Path) -> None:
        self.handle = path.open("a", buffering=1)

    def _write(self, kind: str, payload: dict) -> None:
        self.handle.write(json.dumps({"kind": kind, **payload}) + "\n")

    def started(self, report) -> None:
        self._write("started", report.to_dict())

    def step(self, report) -> None:
        self._write("step", report.to_dict())

    def checkpoint(self, report) -> None:
        self._write("checkpoint", report.to_dict())

    def local_norms(self, report) -> None:
        self._write("local_norms", report.to_dict())

    def heartbeat(self, beat) -> None:
        self._write("heartbeat", dataclasses.asdict(beat))


def reset_peak_rss() -> None:
    """Make this process's peak resident set (``VmHWM``, what trainer.device reads) its resident
    set now: a forked child's starts as its parent's (Linux >= 4.0, ``proc(5)``: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def main(spec_path: str, out_dir: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("own_peak"):
        reset_peak_rss()
    env = DistEnv.from_environ()
    out = Path(out_dir)
    result = train(config_from_dict(spec["config"]), ResumePlan.from_dict(spec.get("plan", {})),
                   FileReporter(out / f"rank{env.rank}.events"), env)
    (out / f"rank{env.rank}.json").write_text(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
