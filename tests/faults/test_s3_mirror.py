"""Durable checkpoints on a real S3 server (SeaweedFS's ``weed mini`` on
127.0.0.1, accepting only the test's identity), on a real `runmgr launch`.

One run is driven through the whole story, each moment reached through the
run's own state (pauses after steps 15 and 35 that the test releases, events
in its logbook): checkpoint 10 mirrored; the S3 server killed; training goes
on to step 35, the logbook records the outage and the local copies wait past
``checkpoint.keep_last=1``; S3 started again on its folder: the copies
complete and the logbook records the recovery; the driver stopped (SIGINT,
Ctrl-C's: a clean stop, no crash dump, the sub-run recorded as stopped),
the local checkpoint folder deleted, and the same command resumes from S3's
copy of step 30 with bit for bit the losses of an uninterrupted run; at the
end every checkpoint is on S3 and each copy verifies against its manifest's
checksums. A fresh machine (an empty run directory) then resumes from S3
alone.

Both launches run on the session's shared Ray: nothing here kills a driver or
reconfigures a cluster (a killed driver's workers and its own Ray are
tests/faults/test_checkpoint_faults.py's and test_driver_lease.py's).
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.config.compose import load_run_config
from runmgr.controller.machine import SubrunIds
from runmgr.lineage import initial_state
from runmgr.s3.client import S3Client
from runmgr.s3.copies import complete_steps, download_checkpoint, transfer_config
from runmgr.s3.mirror import S3Mirror
from tests.e2e.harness import (CRASH_DUMP_MARKS, E2E_OVERRIDES, LaunchedRun, kept_losses, pauses_after, pid_gone,
                               runmgr_text)
from tests.seaweed import SeaweedS3, serving
from trainer.manifest import MANIFEST_NAME, checkpoint_dir, list_checkpoints, step_of, verify_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

BUCKET = "runmgr-e2e"
OUTAGE_AFTER, BACK_AFTER = 15, 35


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> SeaweedS3:
    yield from serving(tmp_path_factory.mktemp("seaweed-e2e"), BUCKET)


def s3_settings(server: SeaweedS3) -> list[str]:
    """Mirroring on, parts small enough that the shards go up in parts, retries and the
    outage threshold short enough for a test. Synchronous saves: checkpoint N is recorded
    before the ranks pause after step N + 5 (the losses are those of asynchronous ones)."""
    return [f"checkpoint.s3.bucket={BUCKET}", f"checkpoint.s3.endpoint={server.endpoint}",
            "checkpoint.s3.multipart_threshold_mib=0.05", "checkpoint.s3.retry_backoff_s=0.2",
            "checkpoint.s3.max_backoff_s=1.0", "checkpoint.s3.connect_timeout_s=1.0", "checkpoint.s3.max_attempts=1",
            "watcher.storage.outage_after_s=2.0", "checkpoint.keep_last=1", "checkpoint.async_save=false"]


def events(run_dir: Path) -> list[dict]:
    with Logbook.open(run_dir, create=False) as book:
        return book.events()


def wait_for_event(run: LaunchedRun, matches, what: str, timeout: float = 120) -> dict:
    """The first logbook record for which ``matches`` holds, polling the run's own logbook."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [e for e in events(run.run_dir) if matches(e)]
        if found:
            return found[0]
        if run.proc is not None and run.proc.poll() is not None:
            pytest.fail(f"driver exited ({run.proc.returncode}) before {what}:\n{run.output()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{run.output()[-3000:]}")


def uploaded(step: int):
    return lambda e: e["type"] == "event" and e["kind"] == "checkpoint_uploaded" and e["data"]["step"] == step


def outage(recovered: bool):
    """An S3 outage incident (its record holds the whole incident), or its end."""
    return lambda e: e["type"] == "incident" and e["kind"] == "storage_outage" and e["evidence"]["recovered"] is recovered


def local_steps(run_dir: Path) -> list[int]:
    return [step_of(p) for p in list_checkpoints(run_dir / "checkpoints") if verify_checkpoint(p, False)[0]]


@pytest.fixture(scope="module")
def mirrored_run(server, tmp_path_factory, shared_ray) -> Path:
    """The story above, up to the end of the relaunch; the run directory."""
    run_dir = tmp_path_factory.mktemp("s3-e2e") / "mirrored"
    # Stopped by a signal, not killed: the shared Ray for both launches (the same command each time).
    extra = [*s3_settings(server), pauses_after(OUTAGE_AFTER, BACK_AFTER),
             f"cluster.address={shared_ray.address}"]
    launched = [LaunchedRun(run_dir, extra=extra, env=server.env()) for _ in range(2)]
    try:
        return _tell_the_story(*launched, server)
    finally:
        for run in launched:  # the story broke off: no driver is left behind
            if run.proc is not None and run.proc.poll() is None:
                run.kill_driver()


def _tell_the_story(run: LaunchedRun, relaunch: LaunchedRun, server: SeaweedS3) -> Path:
    run_dir = run.run_dir
    run.start().wait_paused(OUTAGE_AFTER, index=0)
    wait_for_event(run, uploaded(10), "the copy of checkpoint 10")
    server.kill()  # S3 gone at once, mid-run
    run.release(OUTAGE_AFTER, index=0)

    status = run.wait_paused(BACK_AFTER, index=1)  # training went on without S3
    wait_for_event(run, outage(recovered=False), "the outage in the logbook")
    assert {20, 30} <= set(local_steps(run_dir)), "a checkpoint not on S3 was deleted (keep_last=1)"
    server.start()  # on the same folder and ports: S3 is back with what it held
    wait_for_event(run, uploaded(30), "the copies of checkpoints 20 and 30 after the outage")
    wait_for_event(run, outage(recovered=True), "the recovery in the logbook")

    run.proc.send_signal(signal.SIGINT)  # the run stops as Ctrl-C stops it; its Ray stays
    assert run.wait() == 128 + signal.SIGINT, run.output()[-3000:]
    stopped = run.output()  # a requested stop, not a crash (test_sigterm.py's SIGTERM on a Ray of its own)
    assert f"stopped by signal SIGINT: sub-run 1.00 at step {BACK_AFTER}" in stopped, stopped[-3000:]
    assert not [mark for mark in CRASH_DUMP_MARKS if mark in stopped], stopped[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    assert all(pid_gone(w["pid"]) for w in status["workers"]), "workers outlived their stopped driver"
    run.release(BACK_AFTER, index=1)
    shutil.rmtree(run_dir / "checkpoints")  # the local checkpoint folder is gone
    assert relaunch.start().wait() == 0, relaunch.output()[-3000:]  # the same command again
    return run_dir


def test_training_goes_on_through_an_s3_outage_and_every_copy_completes_when_it_is_back(mirrored_run):
    records = events(mirrored_run)
    ((down, decision),) = [(e, records[i + 1]) for i, e in enumerate(records) if outage(False)(e)]
    assert down["subrun"] == "1.00" and decision["action"] == "keep_local" and "training goes on" in decision["reason"]
    assert set(down["evidence"]["evidence"]["pending_steps"]) & {20, 30}
    (back,) = [e for e in records if outage(True)(e)]
    assert back["subrun"] == "1.00" and back["seq"] > down["seq"]
    starts = [e for e in records if e["type"] == "subrun_start"]
    assert [s["subrun"] for s in starts] == ["1.00", "1.01"], "the outage restarted something"
    ends = [(e["subrun"], e["end_state"], e["last_step"], e["reason"]) for e in records if e["type"] == "subrun_end"]
    assert ends == [("1.00", "stopped", BACK_AFTER, "stopped by signal SIGINT"),
                    ("1.01", "finished", 40, "trained to step 40")]
    timeline = runmgr_text("logbook", "show", str(mirrored_run))
    assert f"stopped at step {BACK_AFTER} — stopped by signal SIGINT" in timeline
    assert "abandoned" not in timeline and "crash" not in timeline
    uploads = {e["data"]["step"]: e["data"] for e in records
               if e["type"] == "event" and e["kind"] == "checkpoint_uploaded"}
    recorded = {e["step"] for e in records if e["type"] == "checkpoint"}
    assert set(uploads) == recorded == {10, 20, 30, 40}, "a checkpoint was never mirrored"
    assert all(u["bytes"] > 0 and u["seconds"] >= 0 and u["url"].startswith(f"s3://{BUCKET}/")
               for u in uploads.values())


def test_the_local_checkpoint_folder_deleted_the_next_launch_resumes_from_s3_bit_for_bit(mirrored_run,
                                                                                           reference_losses):
    records = events(mirrored_run)
    start = next(e for e in records if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["start_step"] == 30
    assert start["evidence"]["fetched_from"] == f"s3://{BUCKET}/mirrored/step_00000030"
    assert any(e["type"] == "event" and e["kind"] == "checkpoint_downloaded" for e in records)
    assert kept_losses(mirrored_run) == reference_losses


def test_every_copy_on_s3_verifies_against_its_manifests_checksums(mirrored_run, server, tmp_path, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    config = load_run_config("demo", [*E2E_OVERRIDES, f"run.name={mirrored_run.name}", *s3_settings(server)])
    s3 = S3Client(config.checkpoint.s3, config.run.name)
    assert complete_steps(s3) == [10, 20, 30, 40]
    for step in (10, 20, 30, 40):
        copy = download_checkpoint(s3, step, tmp_path, transfer_config(s3))  # each file against its sha256
        assert verify_checkpoint(copy) == (True, "ok")
    local = checkpoint_dir(mirrored_run / "checkpoints", 40)
    assert (local / MANIFEST_NAME).read_bytes() == (checkpoint_dir(tmp_path, 40) / MANIFEST_NAME).read_bytes()


def test_a_fresh_machine_resumes_from_s3_alone(mirrored_run, server, tmp_path, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    fresh = tmp_path / "fresh"  # no logbook, no checkpoint: the same run on another machine
    config = load_run_config("demo", [*E2E_OVERRIDES, f"run.name={mirrored_run.name}", f"run.dir={fresh}",
                                      "training.train_iters=50", *s3_settings(server)])
    mirror = S3Mirror(S3Client(config.checkpoint.s3, config.run.name))
    with Logbook.open(fresh) as book:
        first = initial_state(config, book, SubrunIds(1, 0), remote=mirror)
    assert (first.subrun, first.start_step) == ("1.00", 40)
    assert first.evidence["fetched_from"] == f"s3://{BUCKET}/mirrored/step_00000040"
    assert verify_checkpoint(first.plan.start_checkpoint) == (True, "ok")
    assert Path(first.plan.start_checkpoint) == checkpoint_dir(fresh / "checkpoints", 40)
