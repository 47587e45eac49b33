"""status.json says where the driver serves its metrics, and `runmgr status`
shows it while the driver lives."""

from __future__ import annotations

from runmgr.controller.states import Launching
from runmgr.observers.status_file import StatusFileObserver
from runmgr.status import read_status, render_status
from trainer.plan import ResumePlan


def launching() -> Launching:
    return Launching("1.00", ResumePlan(subrun="1.00", data_parallel_size=2), 0, "launch")


def test_the_metrics_address_is_in_the_status_and_its_rendering(tmp_path):
    StatusFileObserver(tmp_path, "demo", 40, 0, metrics_address="127.0.0.1:41235").on_transition(None, launching())
    status = read_status(tmp_path)
    assert status["metrics"] == {"address": "127.0.0.1:41235"} and status["driver_alive"]
    assert "metrics: http://127.0.0.1:41235/metrics" in render_status(status)


def test_without_metrics_the_status_says_none(tmp_path):
    StatusFileObserver(tmp_path, "demo", 40, 0).on_transition(None, launching())
    status = read_status(tmp_path)
    assert status["metrics"] is None and "metrics:" not in render_status(status)
