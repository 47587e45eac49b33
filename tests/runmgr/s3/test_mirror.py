"""The background mirror on a real S3 server: in order, retried while S3 is
out, complete once it is back, and the source a resume falls back to."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import EndpointConnectionError

from runmgr.resume import RemoteUnavailable, find_resume_point
from runmgr.s3.client import S3Client
from runmgr.s3.copies import complete_steps
from runmgr.s3.mirror import MirrorEvent, S3Mirror
from tests.faults.checkpoint_damage import small_checkpoint
from tests.runmgr.s3.conftest import s3_config
from tests.seaweed import SeaweedS3
from trainer.manifest import checkpoint_dir

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def events_until(mirror: S3Mirror, done, timeout_s: float = 60.0) -> list[MirrorEvent]:
    """Collect the mirror's events until ``done(events)`` holds (its own progress, not a race)."""
    events: list[MirrorEvent] = []
    deadline = time.monotonic() + timeout_s
    while not done(events):
        assert time.monotonic() < deadline, f"the mirror did not get there: {events}"
        time.sleep(0.05)
        events += mirror.drain()
    return events


def uploaded_steps(events: list[MirrorEvent]) -> list[int]:
    return [e.step for e in events if e.kind == "uploaded"]


def test_checkpoints_are_mirrored_in_order_and_become_durable(s3, tmp_path):
    mirror = S3Mirror(s3)
    for step in (10, 20, 30):
        mirror.submit(step, small_checkpoint(tmp_path, step))
    mirror.submit(20, checkpoint_dir(tmp_path, 20))  # once is enough
    assert mirror.pending_steps() == (10, 20, 30) and not mirror.is_durable(10)
    mirror.start()
    events = events_until(mirror, lambda e: len(uploaded_steps(e)) == 3)
    assert mirror.finish(5.0) == ()
    assert uploaded_steps(events) == [10, 20, 30] and [e.pending for e in events] == [(20, 30), (30,), ()]
    assert all(mirror.is_durable(step) for step in (10, 20, 30)) and mirror.durable_count() == 3
    assert complete_steps(s3) == [10, 20, 30]


def test_while_s3_is_out_every_attempt_fails_and_once_it_is_back_the_copies_complete(aws_env, tmp_path):
    server = SeaweedS3(tmp_path / "s3")  # its ports are chosen, nothing answers there yet: an outage
    mirror = S3Mirror(S3Client(s3_config(server, "late"), "run"))
    for step in (10, 20):
        mirror.submit(step, small_checkpoint(tmp_path / "ckpt", step))
    mirror.start()
    try:
        failures = events_until(mirror, lambda e: len(e) >= 3)
        assert {(e.kind, e.step) for e in failures} == {("failed", 10)}  # head of the queue, retried
        assert "Could not connect" in failures[0].error and failures[0].pending == (10, 20)
        assert not mirror.is_durable(10)
        server.start()
        server.make_bucket("late")
        events = events_until(mirror, lambda e: uploaded_steps(e) == [10, 20])
        assert mirror.finish(5.0) == () and complete_steps(mirror.s3) == [10, 20]
        assert events[-1].pending == ()
    finally:
        mirror.close()
        server.stop()


def test_a_restart_from_an_earlier_step_retires_the_copies_past_it(s3, tmp_path):
    mirror = S3Mirror(s3)
    for step in (10, 20, 30):
        mirror.submit(step, small_checkpoint(tmp_path, step))
    mirror.start()
    events_until(mirror, lambda e: len(uploaded_steps(e)) == 3)
    mirror.retire_after(10, "1.01")
    (retired,) = [e for e in events_until(mirror, lambda e: any(x.kind == "retired" for x in e)) if e.kind == "retired"]
    assert retired.retired == (20, 30) and complete_steps(s3) == [10]
    assert not mirror.is_durable(20) and mirror.is_durable(10)
    mirror.close()


def test_a_resume_falls_back_to_the_mirror_and_says_so_when_s3_cannot_answer(s3, aws_env, tmp_path):
    mirror = S3Mirror(s3)
    mirror.submit(10, small_checkpoint(tmp_path / "before", 10))
    mirror.start()
    assert mirror.finish(30.0) == ()
    point = find_resume_point(tmp_path / "deleted", remote=mirror)
    assert point.step == 10 and point.fetched_from == f"s3://{s3.place.bucket}/run/step_00000010"
    out = S3Mirror(S3Client(s3_config(SeaweedS3(tmp_path / "none"), s3.place.bucket), "run"))
    with pytest.raises(RemoteUnavailable, match="Could not connect"):
        out.complete_steps()
    nothing = find_resume_point(tmp_path / "empty", remote=out)
    assert nothing.path is None and "cannot be listed" in nothing.rejected[0][1]


def test_decisions_read_the_copies_the_mirror_has_seen_without_asking_s3(s3, tmp_path):
    mirror = S3Mirror(s3)
    mirror.submit(10, small_checkpoint(tmp_path, 10))
    mirror.start()
    assert mirror.finish(30.0) == ()
    known = mirror.known
    assert known.complete_steps() == [10] and known.consumed_samples(10) == 80
    s3.client.meta.events.register("before-call.s3.*", refuse)  # S3 out: the known copies still answer
    assert known.complete_steps() == [10] and known.consumed_samples(10) == 80
    with pytest.raises(RemoteUnavailable):
        mirror.complete_steps()


def refuse(**_):
    raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
