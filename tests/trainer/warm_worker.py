"""A rank (or a ready spare) of a warm-recovery test, run as a script: trains with
the real trainer and a file-driven warm link. The test plays the driver: when a rank
asks where the group re-forms (``<out>/waiting.rank<R>``), the test writes
``<out>/rejoin.json``; the spare waits for the same file. A victim named in the spec
kills itself (SIGKILL) at the heartbeat of a phase and step: a trigger in the run's
own state."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tests.trainer.rank_worker import FileReporter
from trainer.cli import config_from_dict
from trainer.distributed import DistEnv
from trainer.loop import train, train_spare
from trainer.plan import ResumePlan
from trainer import warm
from trainer.parallel import engine
from trainer.rejoin import Rejoin

POLL_S = 0.005


def write_whole(path: Path, data: dict) -> None:
    """Write ``path`` so that whoever sees it sees all of it (the test polls for it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data))
    partial.rename(path)


class FileLink:
    """The warm link of a test: ask by writing a file, wait for the test's answer."""

    buddy_offset = 1

    def __init__(self, out: Path, rank: int) -> None:
        self.out, self.rank = out, rank

    def rejoin(self, error: BaseException, newest_snapshot):
        write_whole(self.out / f"waiting.rank{self.rank}", {"newest": newest_snapshot, "error": str(error)[:300]})
        return self._answer(self.rank)

    def join(self) -> Rejoin:
        write_whole(self.out / "waiting.spare", {})
        answer = self._answer(None)
        assert answer is not None
        return answer

    def _answer(self, rank):
        path = self.out / "rejoin.json"
        while not path.exists():
            time.sleep(POLL_S)
        spec = json.loads(path.read_text())
        if spec.get("cold"):
            return None
        mine = spec["replace"] if rank is None else rank
        return Rejoin(DistEnv(mine, spec["world_size"], 0, "127.0.0.1", spec["port"]), ResumePlan.from_dict(spec["plan"]),
                      {int(k): v for k, v in spec["donors"].items()})


INSIDE_SNAPSHOT = "inside_snapshot"
"""A kill halfway through copying a snapshot: after the model's tensors, before AdamW's."""
AT_RANDOM = "random"
"""A kill a ``share`` (drawn by the test, 0-1) of the step before's time (its step and snapshot,
from one step beat to the next) after the step begins: wherever in the step, or in the snapshot
after it, that lands. A share of the run's own pace, not a fixed delay, so that a faster model or
machine does not carry the kill steps further on."""
IN_REDUCE = "reduce"
"""A kill as the step's gradient all-reduce begins (plain data parallel): after the step's
gather of the losses, so that the survivors' last collective of the step is the one that fails."""


class KillingReporter(FileReporter):
    """Kills this process at the heartbeat of ``phase`` for ``step`` or, for
    :data:`INSIDE_SNAPSHOT`, in the middle of that step's snapshot copy, for
    :data:`IN_REDUCE`, as that step's gradients are averaged, for :data:`AT_RANDOM`,
    a drawn share of the step before's time after that step begins."""

    def __init__(self, path: Path, kill: dict | None) -> None:
        super().__init__(path)
        self.kill = kill
        self.step_beats: list[float] = []
        """When the last two steps began (monotonic)."""

    def heartbeat(self, beat) -> None:
        super().heartbeat(beat)
        if beat.phase == "step":
            self.step_beats = [*self.step_beats[-1:], time.monotonic()]
        if not self.kill or beat.step != self.kill["step"]:
            return
        if beat.phase == self.kill["phase"]:
            os.kill(os.getpid(), signal.SIGKILL)
        if beat.phase == "snapshot" and self.kill["phase"] == INSIDE_SNAPSHOT:
            kill_inside_the_copy()
        if beat.phase == "step" and self.kill["phase"] == IN_REDUCE:
            kill_in_the_reduce()
        if beat.phase == "step" and self.kill["phase"] == AT_RANDOM:
            before = self.step_beats[-1] - self.step_beats[0]  # the step before's, and its snapshot's
            threading.Timer(self.kill["share"] * before, os.kill, (os.getpid(), signal.SIGKILL)).start()


def kill_inside_the_copy() -> None:
    """From now on, the snapshot's copy kills this process when it reaches the optimizer's state
    (trainer.warm copies the model's tensors first, then the optimizer's)."""
    copy = warm.copy_part

    def copying(part, destinations, sources):
        if part == "optimizer":
            os.kill(os.getpid(), signal.SIGKILL)
        return copy(part, destinations, sources)

    warm.copy_part = copying


def kill_in_the_reduce() -> None:
    """From now on, averaging the gradients kills this process (the step's gather is done)."""
    def averaging(params, world_size):
        os.kill(os.getpid(), signal.SIGKILL)

    engine.average_gradients = averaging


def main(spec_path: str, out_dir: str, role: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(out_dir)
    config = config_from_dict(spec["config"])
    if role == "spare":
        result = train_spare(config, FileReporter(out / "spare.events"), FileLink(out, -1))
        (out / "spare.json").write_text(json.dumps(result.to_dict()))
        return
    env = DistEnv.from_environ()
    kill = spec.get("kill") if spec.get("kill", {}).get("rank") == env.rank else None
    result = train(config, ResumePlan.from_dict(spec.get("plan", {})),
                   KillingReporter(out / f"rank{env.rank}.events", kill), env, FileLink(out, env.rank))
    (out / f"rank{env.rank}.json").write_text(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
