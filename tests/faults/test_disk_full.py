"""A full disk under the run directory, on real processes: the run directory
is a small tmpfs mounted in a mount namespace of the test's own (``unshare
-m``), the run is paused after step 15, the test fills the tmpfs, and the
driver's next write fails. It stops the run with one line and a recorded
``failed`` end; a relaunch while the disk is still full is one line, exit 2;
once space is freed, the same command resumes the run bit for bit."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from runmgr.chaos.build import release_file
from tests.e2e.harness import ROOT, LaunchedRun, pause_after, pause_label

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")),
                       reason="needs unshare -m and nsenter (root) to mount a tmpfs of the test's own"),
]

TMPFS_SIZE = "48m"
PAUSE_STEP = 15
RESUME_STEP = 10
"""The newest checkpoint before the pause (the e2e config saves every 10 steps)."""
FULL_LINE = "is full"


class TmpfsNamespace:
    """A mount namespace holding a tmpfs at ``mountpoint``, kept alive by a sleeping
    process; the test reaches its files through ``/proc/<holder>/root``."""

    def __init__(self, mountpoint: Path) -> None:
        mountpoint.mkdir(parents=True)
        self.mountpoint = mountpoint.resolve()
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "$1" && echo mounted && exec sleep 3600', "sh",
             str(self.mountpoint)], stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout.readline().strip() == "mounted"

    def view(self, path: Path) -> Path:
        """``path`` as the namespace sees it (plain file calls; SQLite resolves links, so not for it)."""
        return Path(f"/proc/{self.holder.pid}/root{path}")

    def command(self, *args: str) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *args]

    def runmgr_json_lines(self, *args: str) -> list[dict]:
        out = subprocess.run(self.command(sys.executable, "-m", "runmgr", *args), cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def fill(self, name: str) -> None:
        """Take every free block, in allocations that fit whole or fail whole (the driver writes meanwhile)."""
        where = self.view(self.mountpoint)
        with open(where / name, "ab") as filler:
            while True:
                stat = os.statvfs(where)
                want = stat.f_bavail * stat.f_frsize
                while want >= stat.f_frsize:
                    try:
                        os.posix_fallocate(filler.fileno(), os.fstat(filler.fileno()).st_size, want)
                        break
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        want //= 2
                else:
                    return

    def wait_recorded_checkpoint(self, run: "NamespacedRun", step: int, timeout: float = 180) -> None:
        """Until the logbook records the checkpoint of ``step``: an asynchronous save may still be
        writing when the ranks pause, and a disk filled under it would leave it incomplete."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.runmgr_json_lines("logbook", "events", str(run.real_run_dir), "--json")
            if any(e["type"] == "checkpoint" and e["step"] == step for e in events):
                return
            time.sleep(0.2)
        pytest.fail(f"the checkpoint of step {step} was not recorded within {timeout:.0f} s:\n{run.output()[-3000:]}")

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


class NamespacedRun(LaunchedRun):
    """A `runmgr launch` inside the namespace; its log stays outside the tmpfs."""

    def __init__(self, ns: TmpfsNamespace, run_dir: Path, log_name: str, extra: list[str]) -> None:
        super().__init__(run_dir, extra=extra)
        self.ns = ns
        self.args = ns.command(*self.args)
        self.log = ns.mountpoint.parent / log_name  # the test's own disk, not the tmpfs
        self.run_dir = ns.view(run_dir)  # what status.json and the chaos state are read through
        self.real_run_dir = run_dir

    def release(self, step: int) -> None:
        self.ns.view(release_file(self.real_run_dir, pause_label(step))).touch()


@dataclass
class FullDiskStory:
    stopped_code: int
    stopped_output: str
    status_after_stop: dict
    refused_code: int
    refused_output: str
    resumed_code: int
    resumed_output: str
    events: list[dict]
    losses: dict[int, float]


@pytest.fixture(scope="module")
def story(tmp_path_factory) -> FullDiskStory:
    base = tmp_path_factory.mktemp("diskfull")
    ns = TmpfsNamespace(base / "disk")
    try:
        run_dir = ns.mountpoint / "run"
        # Saves in the training step itself: an asynchronous save is committed at the first step
        # after its write ends, which under load may be after the pause, and the checkpoint the
        # relaunch resumes from would then not be recorded while the ranks are held.
        extra = [pause_after(PAUSE_STEP), "checkpoint.async_save=false"]
        run = NamespacedRun(ns, run_dir, "first.log", extra).start()
        run.wait_paused(PAUSE_STEP)
        ns.wait_recorded_checkpoint(run, RESUME_STEP)
        os.kill(run.proc.pid, signal.SIGSTOP)  # the driver stands still while the test takes every block
        try:
            ns.fill("filler-1")
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)
        stopped_code = run.wait()
        status_after_stop = json.loads((run.run_dir / "status.json").read_text())

        ns.fill("filler-2")  # what the driver's exit gave back (its logbook's WAL): the disk is still full
        refused = NamespacedRun(ns, run_dir, "refused.log", extra).start()
        refused_code = refused.wait()

        for filler in ("filler-1", "filler-2"):
            (ns.view(ns.mountpoint) / filler).unlink()
        run.release(PAUSE_STEP)  # the lineage remembers the pause; the release is belt and braces
        resumed = NamespacedRun(ns, run_dir, "resumed.log", extra).start()
        resumed_code = resumed.wait()

        events = ns.runmgr_json_lines("logbook", "events", str(run_dir), "--json")
        losses = {row["step"]: row["loss"] for row in ns.runmgr_json_lines("logbook", "metrics", str(run_dir),
                                                                           "--json")}
        return FullDiskStory(stopped_code, run.output(), status_after_stop, refused_code, refused.output(),
                             resumed_code, resumed.output(), events, losses)
    finally:
        ns.close()


def test_a_full_disk_stops_the_run_with_one_line_and_a_recorded_failed_end(story):
    assert story.stopped_code == 1, story.stopped_output[-3000:]
    assert "Traceback" not in story.stopped_output
    lines = [line for line in story.stopped_output.splitlines() if FULL_LINE in line]
    assert len(lines) == 1 and "sub-run 1.00 ended as failed at step 15" in lines[0], story.stopped_output[-3000:]
    assert "free space there, then run the same `runmgr launch` again" in lines[0]
    end = next(e for e in story.events if e["type"] == "subrun_end" and e["subrun"] == "1.00")
    assert end["end_state"] == "failed" and end["last_step"] == 15 and FULL_LINE in end["reason"]
    assert story.status_after_stop["state"] == "failed" and story.status_after_stop["workers"] == []


def test_a_relaunch_while_the_disk_is_still_full_is_one_line_and_exit_2(story):
    assert story.refused_code == 2, story.refused_output[-3000:]
    lines = story.refused_output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runmgr: error: the disk holding") and FULL_LINE in lines[0]
    # nothing was written: the resumed launch is the lineage's next sub-run after 1.00
    assert [e["subrun"] for e in story.events if e["type"] == "subrun_start"] == ["1.00", "1.01"]


def test_a_relaunch_after_space_is_freed_resumes_bit_for_bit(story, reference_losses):
    assert story.resumed_code == 0, story.resumed_output[-3000:]
    start = next(e for e in story.events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["cause"].startswith("relaunch: sub-run 1.00 ended as failed at step 15")  # not "abandoned"
    assert start["start_step"] == RESUME_STEP and start["start_checkpoint"].endswith(f"step_{RESUME_STEP:08d}")
    assert story.losses == reference_losses  # exact float equality, every step
