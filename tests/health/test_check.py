"""All per-node probes together, for real, on this machine."""

import hashlib

from health.check import check_node
from health.config import (ComputeChecks, DataChecks, HealthConfig, MountSpec, StorageChecks)


def test_this_node_is_checked_end_to_end(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    dataset = tmp_path / "local.bin"
    dataset.write_bytes(b"tokens" * 1000)
    config = HealthConfig(
        # No floors on speed: this checks that the probes run together, not this disk's speed under load
        # (the floors have their own tests); a loaded CI machine wrote below 100 MB/s.
        storage=StorageChecks(mounts=[MountSpec(path=str(shared), min_free_gb=0.0, min_write_mbps=0.0,
                                                min_read_mbps=0.0, max_latency_ms=60_000.0)],
                              timeout_s=10.0, probe_mb=1, latency_ops=2),
        data=DataChecks(local_path=str(dataset), size_bytes=6000,
                        sha256=hashlib.sha256(b"tokens" * 1000).hexdigest()),
        compute=ComputeChecks(matmul_size=64, repeats=1, bandwidth_mb=1.0))
    clock = iter([1000.0, 1003.5])
    report = check_node(config, node="here", clock=lambda: next(clock), path=str(tmp_path))
    assert (report.node, report.started_at, report.seconds) == ("here", 1000.0, 3.5)
    assert report.severity.value == "ok", [f.message for f in report.findings]
    assert {"compute.matmul_tflops", f"storage.write_mbps@{shared}"} <= set(report.figures)
    assert report.facts["accelerator"] == "cpu" and report.facts["software.torch"]
    assert report.facts["data.size_bytes"] == 6000
