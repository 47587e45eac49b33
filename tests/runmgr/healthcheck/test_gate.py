"""The launch gate on a real (local) Ray: it admits healthy nodes, refuses to
launch on none with one line, keeps the last check's exclusions when the
probes are skipped, and ends by its deadline when a node's probes hang.
(Each probing check starts a benchmark worker of its own, torch imported: the
refusal, the skip and the admission are one run's history, two checks.)"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from health.probes.storage_worker import probe_file_names
from runmgr.config.compose import load_run_config
from runmgr.healthcheck.gate import NoAdmittedNodesError, preflight_health, store_for

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
QUICK = ["health.compute.matmul_size=256", "health.compute.bandwidth_mb=8", "health.storage.probe_mb=1",
         "health.storage.latency_ops=2"]


def config(tmp_path: Path, mount: Path, *extra: str):
    spec = f"[{{path: '{mount}', min_free_gb: 0, min_write_mbps: 0, min_read_mbps: 0, max_latency_ms: 10000}}]"
    return load_run_config("demo", [f"run.dir={tmp_path / 'run'}", f"health.storage.mounts={spec}",
                                    *QUICK, *extra], CONF_DIR)


def test_no_admitted_node_is_one_line_skipping_keeps_the_exclusion_and_a_healthy_node_is_admitted(
        local_ray, tmp_path):
    """One run's history: its mount missing (refused in one line), launched with the probes
    skipped (still refused), repaired (admitted, the report kept with the run), skipped again
    (nothing kept out). One probing check per verdict the story needs."""
    missing = tmp_path / "hpfs" / "ckpt"
    with pytest.raises(NoAdmittedNodesError) as caught:
        preflight_health(config(tmp_path, missing), io.StringIO())
    message = str(caught.value)
    assert "\n" not in message and "ENOENT" in message and "admitted none of 1" in message

    out = io.StringIO()
    with pytest.raises(NoAdmittedNodesError):  # no probes, but the last check's verdict stands
        preflight_health(config(tmp_path, tmp_path, "health.skip=true"), out)
    assert "probes skipped" in out.getvalue()

    out = io.StringIO()
    gate = preflight_health(config(tmp_path, tmp_path), out)  # repaired: admitted again
    node = local_ray.get_runtime_context().get_node_id()
    assert gate.admitted_node_ids == [node] and gate.excluded == {}
    evidence = gate.evidence()
    report = json.loads((tmp_path / "run" / evidence["report"]).read_text())
    assert report["admitted_node_ids"] == [node] and evidence["check_id"] == report["check_id"]
    assert "ADMIT" in out.getvalue() and "[1/1]" in out.getvalue()
    # Each probing check is in the history as the launch's; the skipped ones are not checks.
    assert [c.source for c in store_for(config(tmp_path, tmp_path)).checks()] == ["launch", "launch"]

    gate = preflight_health(config(tmp_path, tmp_path, "health.skip=true"), io.StringIO())
    assert gate.admitted_node_ids is None and gate.excluded == {}


def test_a_node_whose_probes_hang_is_excluded_at_the_node_deadline(local_ray, tmp_path):
    # A FIFO where the storage probe writes its test file: open() blocks for
    # ever, and the probe's own timeout (600 s, past the test's limit) is longer than the
    # node's (3 s): the gate returning at all is the node deadline at work.
    fifo = Path(probe_file_names(str(tmp_path))[0])
    os.mkfifo(fifo)
    try:
        with pytest.raises(NoAdmittedNodesError) as caught:
            preflight_health(config(tmp_path, tmp_path, "health.storage.timeout_s=600",
                                    "health.node_timeout_s=3"), io.StringIO())
        assert "did not finish within health.node_timeout_s=3" in str(caught.value)
    finally:
        _release(fifo)


def _release(fifo: Path) -> None:
    """Let the blocked writer go (it then dies on a closed pipe) and remove the FIFO."""
    try:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    finally:
        fifo.unlink()


def test_nodes_of_one_host_take_turns_for_the_benchmark(tmp_path):
    import threading

    from runmgr.healthcheck.node_task import host_turn

    lock = tmp_path / "compute.lock"
    entered = threading.Event()

    def other_node() -> None:
        with host_turn(lock):
            entered.set()

    with host_turn(lock):
        waiter = threading.Thread(target=other_node)
        waiter.start()
        assert not entered.wait(0.3)  # the other node waits while this one measures
    assert entered.wait(5)
    waiter.join()
