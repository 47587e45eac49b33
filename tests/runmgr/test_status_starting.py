"""Before its first sub-run runs, a driver's status says what it is doing (starting Ray, checking
the nodes), not "has not started a driver": read at the moment the driver reaches each step (the
Ray start and the health check are stood in for here, so the test stops there)."""

from __future__ import annotations

import io

import pytest

from logbook import Logbook
from runmgr import lineage
from runmgr.config.compose import load_run_config
from runmgr.status import read_status, render_status


class Stop(Exception):
    """Ends the launch at the health check: what follows is not this test's."""


def test_the_status_of_a_starting_driver_says_what_it_is_doing(tmp_path, monkeypatch):
    config = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "chaos=none", "cluster.local_nodes=2"])
    seen: list[str] = []

    def connect(cluster, **_):
        seen.append(render_status(read_status(config.run_dir())))

    def health(config, out):
        seen.append(render_status(read_status(config.run_dir())))
        raise Stop

    monkeypatch.setattr(lineage.ray_cluster, "connect", connect)
    monkeypatch.setattr(lineage.ray_cluster, "disconnect", lambda connection: None)
    monkeypatch.setattr(lineage, "preflight_health", health)
    with Logbook.open(config.run_dir()) as book, pytest.raises(Stop):
        lineage.run_lineage(config, recompose=lambda overrides: config, book=book, out=io.StringIO())
    ray, checking = seen
    assert "state starting" in ray and "step 0/200" in ray and "(alive)" in ray
    assert "the driver is starting a local Ray of 2 node(s)" in ray
    assert "the driver is health-checking the nodes" in checking


def test_a_starting_driver_that_is_gone_reads_as_stopped(tmp_path):
    from runmgr.status import write_starting, write_status

    write_starting(tmp_path, "demo", 200, 0, "starting a local Ray of 3 node(s)")
    status = read_status(tmp_path)
    assert status["state"] == "starting" and status["driver_alive"]
    write_status(tmp_path, {**status, "driver_pid": 2 ** 22 + 12345})  # no such process
    assert read_status(tmp_path)["state"] == "stopped (starting when the driver was lost)"
