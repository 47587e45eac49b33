"""A real Prometheus (the Debian package; `make test` installs it) scrapes a
real run's driver (on the session's Ray). The ranks hold after step 6 (chaos
pause_at_step) and the test kills rank 1; the run restarts from its step-5
checkpoint as sub-run 1.01 and holds again after step 12: at that moment
Prometheus' loss, ETTR, sub-run and incidents are the logbook's, and every query
of the committed Grafana dashboard returns data. Prometheus evaluates runmgr's alerting rules
(runmgr/metrics/alerts.py, with no hold) and a real Alertmanager posts the stall of that second
hold to a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from runmgr.metrics import alerts, names
from tests.e2e.harness import E2E_OVERRIDES, LaunchedRun, runmgr_text
from tests.prometheus import Prometheus, stall_notice
from tests.prometheus import alerting as servers
from tests.runmgr.metrics.test_dashboard import dashboard_queries
from tests.webhook import receiver  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

PAUSES = ((0, 6), (1, 12))
"""(index in the chaos schedule, step): where every rank waits for the test."""
SHORT = [o for o in E2E_OVERRIDES if not o.startswith(("training.train_iters=", "checkpoint.save_interval="))] + [
    "training.train_iters=14", "checkpoint.save_interval=5"]
"""The e2e config, as short as the story allows: a checkpoint before the kill, steps after each pause."""
STALL_AT_ONCE = alerts.AlertThresholds(hold="0s", stall_at_least_s=3.0)
SCHEDULE = "chaos.faults=[" + ", ".join(f"{{kind: pause_at_step, at_step: {step}}}" for _, step in PAUSES) + "]"


def pause_label(index: int, step: int) -> str:
    return f"{index}:pause_at_step@{step}"


def wait_paused(run: LaunchedRun, index: int, step: int) -> dict:
    """Until every rank has finished ``step`` and waits there, and the lineage recorded the pause."""
    status = run.wait_for(lambda s: s["state"] == "running" and bool(s["workers"])
                          and s.get("paused_ranks") == sorted(w["rank"] for w in s["workers"])
                          and ChaosState(run.run_dir).has_fired(pause_label(index, step)),
                          timeout=300, what=f"every rank paused after step {step}")
    assert status["step"] == step, status
    return status


@pytest.fixture
def alerting(tmp_path, receiver):
    """Alertmanager posting to the webhook receiver, and Prometheus evaluating runmgr's rules
    (built with no hold and a 3 s floor, so a stall fires within seconds) and sending to it."""
    with servers(tmp_path, receiver.url, STALL_AT_ONCE) as prometheus:
        yield prometheus


def served(prometheus: Prometheus) -> dict:
    """Prometheus' answers for loss, ETTR, sub-run and incidents, as plain values."""
    value = lambda result: float(result["value"][1])  # noqa: E731 - one line of JSON shape
    loss, ettr = prometheus.query("runmgr_loss"), prometheus.query("runmgr_ettr_ratio")
    return {
        "loss": value(loss[0]) if loss else None,
        "ettr": value(ettr[0]) if ettr else None,
        "subrun": {r["metric"]["subrun"]: value(r) for r in prometheus.query("runmgr_subrun")},
        "incidents": {r["metric"]["kind"]: value(r) for r in prometheus.query("runmgr_incidents_total > 0")},
    }


def logbook_now(run_dir: Path) -> dict:
    """The same figures from the run's logbook, read as `runmgr logbook` reads it."""
    with Logbook.open(run_dir, create=False) as book:
        summary, lineage, recorded = book.summary(), book.lineage(), book.all_metrics()
    return {
        "loss": recorded[-1]["loss"],
        "ettr": summary["ettr"],
        "subrun": {lineage[-1].id: float(lineage[-1].index)},
        "incidents": {kind: float(count) for kind, count in summary["incidents"].items()},
    }


def test_prometheus_scraping_a_run_sees_what_its_logbook_holds_pages_its_stall_and_every_dashboard_query_has_data(
        tmp_path, alerting, receiver, shared_ray):
    prometheus = alerting
    run = LaunchedRun(tmp_path / "scraped", base=SHORT,
                      extra=[SCHEDULE, f"cluster.address={shared_ray.address}"]).start()
    status = wait_paused(run, *PAUSES[0])
    address = json.loads(runmgr_text("status", str(run.run_dir), "--json"))["metrics"]["address"]
    assert address == status["metrics"]["address"] and address.startswith("127.0.0.1:")
    prometheus.scrape(address)  # the port the driver took
    os.kill(next(w["pid"] for w in status["workers"] if w["rank"] == 1), signal.SIGKILL)
    status = wait_paused(run, *PAUSES[1])
    assert status["subrun"] == "1.01"  # the killed worker's restart

    deadline, seen, expected = time.time() + 120, None, None
    while time.time() < deadline:  # each scrape lands within a second or so: poll until they agree
        seen, expected = served(prometheus), logbook_now(run.run_dir)
        if seen == expected:
            break
        time.sleep(0.5)
    assert seen == expected
    assert expected["subrun"] == {"1.01": 1.0} and expected["incidents"].get("worker_death") == 1.0
    assert 0 < expected["ettr"] < 1 and math.isfinite(expected["loss"])

    # The ranks hold after step 12 until released: a stalled run, paged through Alertmanager.
    (last_step,) = prometheus.query(names.LAST_STEP_AT.name)  # step 12's report: its loss is served
    alert = stall_notice(receiver, address, after=float(last_step["value"][1]))
    assert alert["labels"]["severity"] == "page" and alert["labels"]["job"] == "runmgr"
    assert alert["annotations"]["summary"].startswith(f"runmgr run at {address} has not stepped for ")
    assert receiver.paths[0] == "/hook/secret-token"
    holding = {a["labels"]["alertname"] for a in prometheus.alerts() if a["labels"]["instance"] == address}
    assert "RunmgrStalled" in holding and "RunmgrNeedsPerson" not in holding, holding

    queries = dashboard_queries()
    deadline, empty = time.time() + 60, queries
    while empty and time.time() < deadline:
        empty = [expr for expr in empty if not prometheus.query(expr)]
        time.sleep(0.5)
    assert empty == [], f"dashboard queries without data: {empty}"

    release_file(run.run_dir, pause_label(*PAUSES[1])).touch()
    assert run.wait() == 0, run.output()[-3000:]
