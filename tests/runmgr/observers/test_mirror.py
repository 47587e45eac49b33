"""Between the controller and the S3 mirror: each recorded checkpoint is handed
over, each sub-run's start retires the copies past it, what the mirror did
reaches the logbook (``checkpoint_uploaded`` with step, seconds and bytes) and
the judge; retention keeps a local checkpoint until its copy verifies. The
mirror here is a stand-in that plays back events: the real one is tested on a
real S3 server (tests/runmgr/s3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Launching, Running
from runmgr.observers.mirror import MirrorObserver
from runmgr.observers.retention import RetentionObserver
from runmgr.s3.copies import Uploaded
from runmgr.s3.mirror import MirrorEvent
from tests.faults.checkpoint_damage import small_checkpoint
from trainer.manifest import list_checkpoints, step_of
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

RUNNING = Running("1.00", ResumePlan(subrun="1.00"), 0)


class StandInMirror:
    """What the observer and retention ask of the mirror, with events to play back."""

    location = "s3://ckpt/run"

    def __init__(self) -> None:
        self.submitted: list[int] = []
        self.retired_after: list[tuple[int, str]] = []
        self.durable: set[int] = set()
        self.events: list[MirrorEvent] = []

    def submit(self, step: int, path: Path) -> None:
        self.submitted.append(step)

    def retire_after(self, step: int, tag: str) -> None:
        self.retired_after.append((step, tag))

    def drain(self) -> list[MirrorEvent]:
        events, self.events = self.events, []
        return events

    def is_durable(self, step: int) -> bool:
        return step in self.durable

    def durable_count(self) -> int:
        return len(self.durable)


def recorded(save_dir: Path, step: int) -> GroupPoll:
    return GroupPoll(checkpoints=[CheckpointReport("1.00", step, str(save_dir / f"step_{step:08d}"), 0.1, 0.0)])


def test_recorded_checkpoints_go_to_the_mirror_and_its_uploads_to_the_logbook_and_the_judge(tmp_path):
    mirror = StandInMirror()
    with Logbook.open(tmp_path / "run") as book:
        observer = MirrorObserver(mirror, book)
        launching = Launching("1.00", ResumePlan(subrun="1.00"), 0, "launch")
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        observer.on_transition(None, launching)
        mirror.events = [
            MirrorEvent("failed", 10, 1001.0, error="Could not connect", attempts=1, pending=(10,)),
            MirrorEvent("uploaded", 10, 1012.5, uploaded=Uploaded(10, 4096, 3, 1000.0, 80, "sha256"), upload_s=0.5,
                        attempts=2),
            MirrorEvent("skipped", 20, 1013.0, error="step_00000020 is gone", attempts=1)]
        observer.on_poll(RUNNING, recorded(tmp_path, 20))
        events = [e for e in book.events() if e["type"] == "event"]
    assert mirror.submitted == [20] and mirror.retired_after == [(0, "1.00")]
    uploaded, skipped = events
    assert uploaded["kind"] == "checkpoint_uploaded" and uploaded["step"] == 10
    assert {k: uploaded["data"][k] for k in ("step", "seconds", "bytes")} == {"step": 10, "seconds": 12.5, "bytes": 4096}
    assert uploaded["data"]["url"] == "s3://ckpt/run/step_00000010"
    assert skipped["kind"] == "checkpoint_upload_skipped" and "is gone" in skipped["message"]
    assert [(o.step, o.ok) for o in observer.read_uploads()] == [(10, False), (10, True)]
    assert observer.read_uploads() == []


def test_retention_keeps_what_is_not_on_s3_beyond_keep_last_and_lets_it_go_once_it_is(tmp_path):
    for step in (10, 20, 30):
        small_checkpoint(tmp_path, step)
    mirror = StandInMirror()
    mirror.durable = {10}  # S3 went out after the copy of 10
    retention = RetentionObserver(tmp_path, keep_last=1, rollback_reach=0, durable=mirror)
    retention.on_poll(RUNNING, recorded(tmp_path, 30))
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [20, 30]
    retention.on_poll(RUNNING, GroupPoll())  # nothing new on S3: nothing to look at
    mirror.durable |= {20, 30}  # S3 is back
    retention.on_poll(RUNNING, GroupPoll())
    assert [step_of(p) for p in list_checkpoints(tmp_path)] == [30]
