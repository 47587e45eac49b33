"""A real Prometheus (the Debian package; `make test` installs it) scrapes a
real run's driver (on the session's Ray). The ranks hold after step 6 (chaos
pause_at_step) and the test kills rank 1; the run restarts from its step-5
checkpoint as sub-run 1.01 and holds again after step 12: at that moment
Prometheus' loss, ETTR, sub-run and incidents are the logbook's, and every query
of the committed Grafana dashboard returns data."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from runmgr.ports import rendezvous_port
from tests.e2e.harness import E2E_OVERRIDES, LaunchedRun, runmgr_text
from tests.runmgr.metrics.test_dashboard import dashboard_queries

pytestmark = pytest.mark.slow

PAUSES = ((0, 6), (1, 12))
"""(index in the chaos schedule, step): where every rank waits for the test."""
SHORT = [o for o in E2E_OVERRIDES if not o.startswith(("training.train_iters=", "checkpoint.save_interval="))] + [
    "training.train_iters=14", "checkpoint.save_interval=5"]
"""The e2e config, as short as the story allows: a checkpoint before the kill, steps after each pause."""
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


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


class Prometheus:
    """A Prometheus server on 127.0.0.1 scraping the targets of a file every second."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).is_file():
            pytest.fail("no prometheus binary: `apt-get install -y prometheus` (`make test` installs it)")
        self.targets = workdir / "targets.json"
        self.targets.write_text("[]")
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "runmgr", "file_sd_configs": [{"files": [str(self.targets)]}]}],
        }))
        self.address = f"127.0.0.1:{free_port()}"
        self.log = open(workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address={self.address}"], stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(workdir / "prometheus.log")

    def _wait_ready(self, log: Path, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited ({self.proc.returncode}):\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"prometheus not ready after {timeout} s:\n{log.read_text()[-2000:]}")

    def scrape(self, address: str) -> None:
        self.targets.write_text(json.dumps([{"targets": [address]}]))

    def query(self, expr: str) -> list[dict]:
        url = f"http://{self.address}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            answer = json.load(reply)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus(tmp_path):
    server = Prometheus(tmp_path)
    yield server
    server.close()


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


def test_prometheus_scraping_a_run_sees_what_its_logbook_holds_and_every_dashboard_query_has_data(
        tmp_path, prometheus, shared_ray):
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

    queries = dashboard_queries()
    deadline, empty = time.time() + 60, queries
    while empty and time.time() < deadline:
        empty = [expr for expr in empty if not prometheus.query(expr)]
        time.sleep(0.5)
    assert empty == [], f"dashboard queries without data: {empty}"

    release_file(run.run_dir, pause_label(*PAUSES[1])).touch()
    assert run.wait() == 0, run.output()[-3000:]
