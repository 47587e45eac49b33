"""The exporter beside the real logbook writer, fed by the controller stepped
over fake worker groups (the real judge and policy): at every transition and
poll, what a scrape returns is what the logbook holds at that moment."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import generate_latest

from logbook import Logbook
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Finished, Launching
from runmgr.metrics import names
from runmgr.metrics.exporter import MetricsObserver, health_verdicts
from runmgr.observers.logbook_writer import LogbookObserver
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport

CONFIG = {"training": {"train_iters": 30}}


def checkpoint(step: int, subrun: str = "1.00") -> CheckpointReport:
    return CheckpointReport(subrun, step, f"/run/checkpoints/step_{step:08d}", 0.5, 1000.0 + step)


def scrape(registry: CollectorRegistry) -> dict[str, dict[tuple, float]]:
    """What Prometheus would read: {sample name: {labels: value}}, through the text format."""
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def agrees_with_the_logbook(samples: dict, book: Logbook, reported: bool = True) -> None:
    """``reported``: the exporter has seen this lineage's step reports (not a relaunch's fresh one)."""
    summary, lineage, recorded = book.summary(), book.lineage(), book.all_metrics()
    if recorded and reported:  # the last step reported, as recorded (after a restart: the last one before it)
        assert samples["runmgr_loss"][()] == recorded[-1]["loss"]
        assert samples["runmgr_step"][()] == recorded[-1]["step"]
    ettr = samples["runmgr_ettr_ratio"][()]
    assert (math.isnan(ettr) and summary["ettr"] is None) or ettr == summary["ettr"]
    assert samples["runmgr_lost_steps_total"][()] == summary["steps_lost"]
    assert samples["runmgr_lost_seconds"][()] == summary["lost_time_s"]
    served = {dict(labels)["kind"]: value for labels, value in samples["runmgr_incidents_total"].items() if value}
    assert served == summary["incidents"]
    if lineage:
        assert samples["runmgr_subrun"] == {(("subrun", lineage[-1].id),): lineage[-1].index}


class Probe:
    """An observer after the exporter: scrapes at every moment of the run and compares."""

    def __init__(self, registry: CollectorRegistry, book: Logbook) -> None:
        self.registry, self.book, self.checked = registry, book, 0

    def _check(self) -> None:
        agrees_with_the_logbook(scrape(self.registry), self.book)
        self.checked += 1

    def on_transition(self, old, new) -> None:
        self._check()

    def on_poll(self, state, poll) -> None:
        self._check()

    def on_judgement(self, state, judgement) -> None:
        """The logbook writer records the incident and decision first; the next transition or poll checks them."""


class ExporterClock:
    """The exporter's clock: a second later at each reading, from 5000."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def run_with_a_death_and_an_exclusion(book: Logbook, registry: CollectorRegistry):
    """1.00 trains to 25 and loses rank 1; 1.01 sees an ECC error on node1 at step 28
    (no spare: data parallel shrinks); 1.02 finishes (as tests/runmgr/observers/test_logbook_writer.py)."""
    first = FakeGroup([GroupPoll(steps=[step_report(s, loss=3.0 - s / 100) for s in range(1, 21)],
                                 checkpoints=[checkpoint(20)]),
                       GroupPoll(steps=[step_report(s) for s in range(21, 26)], failures=[died(1)])])
    second = FakeGroup([GroupPoll(steps=[step_report(s, subrun="1.01") for s in range(21, 29)])])
    third = FakeGroup([GroupPoll(steps=[step_report(s, loss=1.5, subrun="1.02") for s in range(21, 31)]),
                       GroupPoll(finished_ranks=[0])])
    points = {25: ResumePoint("/run/checkpoints/step_00000020", 20), 28: ResumePoint("/run/checkpoints/step_00000020", 20)}
    exporter = MetricsObserver(book, train_iters=30, save_interval=20, clock=ExporterClock())
    registry.register(exporter)
    probe = Probe(registry, book)
    controller, _ = make_controller([first, second, third], points=points, slots={"node0": 1, "node1": 1},
                                    observers=(LogbookObserver(book, CONFIG), exporter, probe))
    ecc = [DeviceObservation("node1", 0, "ecc", 2000.0, correctable=0, uncorrectable=2)]
    controller.read_devices = lambda: ecc if controller.state.subrun == "1.01" else []
    return controller.run(), probe


def test_every_scrape_of_a_run_with_restarts_equals_the_logbook_at_that_moment(tmp_path):
    registry = CollectorRegistry(auto_describe=False)
    with Logbook.open(tmp_path) as book:
        final, probe = run_with_a_death_and_an_exclusion(book, registry)
        assert isinstance(final, Finished)
        assert probe.checked > 6  # launches, restarts, polls: each moment compared
        samples = scrape(registry)
        agrees_with_the_logbook(samples, book)
        summary = book.summary()
    assert summary["incidents"] == {"worker_death": 1, "device_fault": 1}  # the story really had incidents
    assert samples["runmgr_loss"][()] == 1.5 and samples["runmgr_step"][()] == 30
    assert samples["runmgr_subrun"] == {(("subrun", "1.02"),): 2}
    assert samples["runmgr_state"][(("runmgr_state", "finished"),)] == 1
    assert samples["runmgr_state"][(("runmgr_state", "running"),)] == 0
    decisions = {dict(k)["action"]: v for k, v in samples["runmgr_decisions_total"].items() if v}
    assert decisions == {"restart": 1, "exclude_node": 1}
    assert samples["runmgr_excluded_nodes"][()] == 1  # 1.02 avoids node1
    assert samples["runmgr_checkpoint_step"][()] == 20
    assert samples["runmgr_lost_steps_total"][()] == 5 + 8  # 21-25 and 21-28 trained again
    assert math.isnan(samples["runmgr_checkpoint_upload_lag_seconds"][()])  # no S3 mirror
    # What the stall and checkpoint alerts read: the last report's arrival, the learned step time, the interval.
    assert samples["runmgr_last_step_timestamp_seconds"][()] > 5000  # the exporter's clock at that poll, not 1030
    assert samples["runmgr_step_time_median_seconds"][()] == 0.1  # every fake step took 0.1 s
    assert samples["runmgr_checkpoint_interval_steps"][()] == 20


def test_the_last_step_s_arrival_is_when_the_poll_that_carried_it_was_seen(tmp_path):
    """A poll without steps (a silent group) leaves the arrival where the last step put it: the
    stall alert's clock runs from there."""
    clock = ExporterClock()
    registry = CollectorRegistry(auto_describe=False)
    with Logbook.open(tmp_path) as book:
        exporter = MetricsObserver(book, train_iters=30, clock=clock)
        registry.register(exporter)
        running = make_controller([FakeGroup([])])[0].state
        exporter.on_poll(running, GroupPoll(steps=[step_report(1), step_report(2)]))
        stepped_at = clock.now
        exporter.on_poll(running, GroupPoll())
        samples = scrape(registry)
    assert samples["runmgr_last_step_timestamp_seconds"][()] == stepped_at
    assert "runmgr_checkpoint_interval_steps" not in samples  # no interval given: none served


def test_a_scrape_serves_exactly_the_metrics_names_lists(tmp_path):
    registry = CollectorRegistry(auto_describe=False)
    with Logbook.open(tmp_path) as book:
        run_with_a_death_and_an_exclusion(book, registry)
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    served = {(name + "_total" if family.type == "counter" else name): family.type for name, family in families.items()}
    # Health verdicts come with a launch's gate evidence, which these fakes have not.
    expected = {spec.name: ("gauge" if spec.type == "stateset" else spec.type) for spec in names.ALL
                if spec is not names.HEALTH_NODES}
    assert served == expected


def test_a_relaunch_serves_the_lineage_counts_the_logbook_holds(tmp_path):
    with Logbook.open(tmp_path) as book:
        run_with_a_death_and_an_exclusion(book, CollectorRegistry(auto_describe=False))
    with Logbook.open(tmp_path) as book:  # a new driver on the same run: its exporter saw none of that
        registry, exporter = CollectorRegistry(auto_describe=False), MetricsObserver(book, train_iters=30)
        registry.register(exporter)
        relaunch = Launching("1.03", ResumePlan(subrun="1.03", data_parallel_size=2), 30, "relaunch", {})
        for observer in (LogbookObserver(book, CONFIG), exporter):
            observer.on_transition(None, relaunch)
        samples = scrape(registry)
        agrees_with_the_logbook(samples, book, reported=False)
    assert "runmgr_loss" not in samples  # until the relaunch's first step report
    assert samples["runmgr_incidents_total"][(("kind", "worker_death"),)] == 1
    assert samples["runmgr_incidents_total"][(("kind", "hang"),)] == 0  # known kinds start at 0
    assert samples["runmgr_subrun"] == {(("subrun", "1.03"),): 3}


def test_two_runs_in_one_prometheus_are_told_apart_by_their_run_label(tmp_path):
    """Issue 32: the gauges carried no run label, so two runs' series collided in one Prometheus."""
    served = {}
    for name in ("run12", "run13"):
        with Logbook.open(tmp_path / name) as book:
            registry = CollectorRegistry(auto_describe=False)
            exporter = MetricsObserver(book, train_iters=30, run=name)
            registry.register(exporter)
            launch = Launching(f"{name[3:]}.00", ResumePlan(subrun=f"{name[3:]}.00", data_parallel_size=2), 0,
                               "launch", {})
            for observer in (LogbookObserver(book, CONFIG), exporter):
                observer.on_transition(None, launch)
            served[name] = scrape(registry)
    for name, samples in served.items():
        assert samples["runmgr_train_iters"] == {(("run", name),): 30}
        assert samples["runmgr_subrun"] == {(("run", name), ("subrun", f"{name[3:]}.00")): 0}
        assert all(dict(labels).get("run") == name for series in samples.values() for labels in series)


def test_upload_lag_is_read_from_the_uploads_the_mirror_records(tmp_path):
    now = [5000.0]
    with Logbook.open(tmp_path, clock=lambda: now[0]) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        exporter = MetricsObserver(book, train_iters=30, mirrored=True, clock=lambda: now[0])
        registry = CollectorRegistry(auto_describe=False)
        registry.register(exporter)
        assert scrape(registry)["runmgr_checkpoint_upload_lag_seconds"][()] == 0  # nothing to upload yet
        book.record_checkpoint("1.00", 10, "/run/checkpoints/step_00000010", 1.0)
        now[0] = 5030.0
        book.record_checkpoint("1.00", 20, "/run/checkpoints/step_00000020", 1.0)
        now[0] = 5045.0
        samples = scrape(registry)
        assert samples["runmgr_checkpoint_upload_lag_seconds"][()] == 45  # 10 waits since 5000
        assert samples["runmgr_checkpoint_age_seconds"][()] == 15 and samples["runmgr_checkpoint_step"][()] == 20
        book.record_event("1.00", names.UPLOADED_EVENT, "step 10 mirrored", {"step": 10, "seconds": 2.0, "bytes": 9})
        assert scrape(registry)["runmgr_checkpoint_upload_lag_seconds"][()] == 15  # 20 waits since 5030
        book.record_event("1.00", names.UPLOADED_EVENT, "step 20 mirrored", {"step": 20, "seconds": 2.0, "bytes": 9})
        assert scrape(registry)["runmgr_checkpoint_upload_lag_seconds"][()] == 0
        book.record_checkpoint("1.00", 30, "/run/checkpoints/step_00000030", 1.0)
        now[0] = 5050.0
        assert scrape(registry)["runmgr_checkpoint_upload_lag_seconds"][()] == 5
        # A relaunch's mirror finds 30's copy complete (its upload event was never recorded).
        book.record_event("1.00", names.FOUND_ON_S3_EVENT, "step 30 already on S3", {"step": 30}, step=30)
        assert scrape(registry)["runmgr_checkpoint_upload_lag_seconds"][()] == 0


def test_health_verdicts_come_from_the_gate_evidence_a_sub_run_records():
    checked = {"skipped": False, "summary": {"nodes": 5, "admit": 3, "warn": 1, "exclude": 1}}
    assert health_verdicts(checked) == {"admit": 3, "warn": 1, "exclude": 1, "unchecked": 0}
    skipped = {"skipped": True, "summary": {"nodes": 3, "exclude": 1}}
    assert health_verdicts(skipped) == {"admit": 0, "warn": 0, "exclude": 1, "unchecked": 2}
