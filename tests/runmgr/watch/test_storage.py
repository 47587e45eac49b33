"""The durable tier failing (OPT's "blob storage issues"): a pure detector over the
S3 mirror's timestamped attempts, with the clock injected as ``now``."""

from __future__ import annotations

from runmgr.config.watcher import StorageConfig, WatcherConfig
from runmgr.watch.incidents import STORAGE_OUTAGE
from runmgr.watch.observations import UploadObservation
from runmgr.watch.storage import StorageOutageDetector
from runmgr.watch.watcher import Watcher

CONFIG = StorageConfig(outage_after_s=60.0)


def failed(step: int, at: float, pending=(20, 30)) -> UploadObservation:
    return UploadObservation(step, at, ok=False, error="Could not connect to the endpoint URL", pending_steps=pending)


def uploaded(step: int, at: float, pending=()) -> UploadObservation:
    return UploadObservation(step, at, ok=True, pending_steps=pending)


def test_failures_shorter_than_the_threshold_are_a_blip_the_retries_absorb():
    detector = StorageOutageDetector(CONFIG)
    assert detector.update(failed(20, 100.0), now=100.0) == []
    assert detector.update(failed(20, 130.0), now=130.0) == []
    assert detector.check(now=159.0) == []
    assert detector.update(uploaded(20, 159.5), now=159.5) == []  # no outage was reported: no recovery either
    assert detector.check(now=1000.0) == []


def test_failures_for_the_threshold_are_one_outage_reported_by_time_alone_and_only_once():
    detector = StorageOutageDetector(CONFIG)
    detector.update(failed(20, 100.0), now=100.0)
    assert detector.check(now=159.9) == []
    (outage,) = detector.check(now=160.0)  # no new attempt needed: the mirror is backing off
    assert outage.kind == STORAGE_OUTAGE and not outage.recovered and outage.onset_step == 20
    assert outage.evidence["failures"] == 1 and outage.evidence["pending_steps"] == [20, 30]
    assert "failed for 60 s" in outage.description and "Could not connect" in outage.description
    assert detector.update(failed(20, 200.0), now=200.0) == []
    assert detector.check(now=5000.0) == []


def test_the_first_success_after_an_outage_reports_its_recovery():
    detector = StorageOutageDetector(CONFIG)
    detector.update(failed(20, 100.0), now=100.0)
    detector.update(failed(20, 170.0), now=170.0)
    (recovery,) = detector.update(uploaded(20, 250.0, pending=(30,)), now=250.0)
    assert recovery.kind == STORAGE_OUTAGE and recovery.recovered
    assert recovery.evidence["outage_s"] == 150.0 and recovery.evidence["failures"] == 2
    assert recovery.evidence["pending_steps"] == [30]
    assert detector.update(uploaded(30, 251.0), now=251.0) == []
    # A later spell is a new outage.
    detector.update(failed(40, 300.0), now=300.0)
    assert [i.recovered for i in detector.check(now=360.0)] == [False]


def test_the_watcher_routes_uploads_to_it_and_an_outage_outlives_a_new_subrun():
    watcher = Watcher(WatcherConfig(storage=CONFIG))
    assert watcher.observe(failed(20, 100.0), now=100.0) == []
    watcher = watcher.for_new_subrun({0: "node-a"})  # a restart meanwhile: the uploads go on
    assert [i.kind for i in watcher.check(now=161.0)] == [STORAGE_OUTAGE]
    assert [i.recovered for i in watcher.observe(uploaded(20, 170.0), now=170.0)] == [True]
