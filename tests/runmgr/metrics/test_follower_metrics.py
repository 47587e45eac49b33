"""A shadow follower serves the same Prometheus metrics as a launched run, and the same alerting
rules page on it: a real `runmgr watch follow` process on a Megatron-LM log that another process
(`runmgr watch play`) writes, scraped by a real Prometheus that evaluates runmgr's rules (no
hold, a 3 s floor) and sends to a real Alertmanager. What Prometheus serves is what the
follower's logbook holds, and when the log goes silent the stall reaches a webhook on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.metrics import alerts, names
from tests.prometheus import Prometheus, stall_notice
from tests.prometheus import alerting as servers
from tests.webhook import receiver  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
LIVE_LOG = ROOT / "tests" / "data" / "live" / "megatron_spikes_and_hang.log"
STALL_AT_ONCE = alerts.AlertThresholds(hold="0s", stall_at_least_s=3.0, stall_step_times=0.3)
"""No hold, a 3 s floor, and 0.3 learned step times: the log says its iterations take 5 s (the
median the follower serves), and it is played ``SPEED`` times faster."""
SPEED = 1000
"""The log's 30 minutes in 1.8 s (at 300, 6 s of waiting): the served step time is the log's own
(5 s), not the pace it is played at, so the stall's threshold is the same 3 s floor."""


@pytest.fixture
def alerting(tmp_path, receiver):
    with servers(tmp_path, receiver.url, STALL_AT_ONCE) as prometheus:
        yield prometheus


def value(prometheus: Prometheus, expr: str) -> float | None:
    found = prometheus.query(expr)
    return float(found[0]["value"][1]) if found else None


def test_a_follower_serves_what_its_logbook_holds_and_its_job_s_silence_pages(tmp_path, alerting, receiver):
    prometheus = alerting
    log, run_dir = tmp_path / "train.log", tmp_path / "beside"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    follower = subprocess.Popen(
        [sys.executable, "-m", "runmgr", "watch", "follow", str(log), "conf=shadow", f"run.dir={run_dir}",
         "metrics.address=127.0.0.1:0", "watcher.hang.step.min_s=2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = follower.stdout.readline()
        address = re.search(r"metrics at http://([\d.]+:\d+)/metrics", banner).group(1)
        prometheus.scrape(address)
        played = subprocess.run([sys.executable, "-m", "runmgr", "watch", "play", str(LIVE_LOG), str(log),
                                 "--speed", str(SPEED)], env=env, timeout=300)
        assert played.returncode == 0

        def served_incidents() -> dict:
            return {r["metric"]["kind"]: float(r["value"][1]) for r in prometheus.query(f"{names.INCIDENTS.name} > 0")}

        deadline = time.time() + 120  # each scrape lands within a second or so; the hang 2 s after the last line
        while time.time() < deadline and served_incidents() != {"loss_spike": 2.0, "hang": 1.0}:
            time.sleep(0.5)
        with Logbook.open(run_dir, create=False) as book:
            last = book.all_metrics()[-1]
            incidents = book.summary()["incidents"]
        assert served_incidents() == {kind: float(count) for kind, count in incidents.items()}
        assert incidents == {"loss_spike": 2, "hang": 1}
        assert last["step"] == 360 and value(prometheus, names.STEP.name) == 360.0
        assert value(prometheus, names.LOSS.name) == pytest.approx(last["loss"])
        assert value(prometheus, f'{names.STATE.name}{{runmgr_state="running"}}') == 1.0

        last_step_at = value(prometheus, names.LAST_STEP_AT.name)
        alert = stall_notice(receiver, address, after=last_step_at)
        assert alert["labels"]["severity"] == "page"
    finally:
        follower.send_signal(signal.SIGINT)
        try:
            follower.communicate(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert follower.returncode == 0
