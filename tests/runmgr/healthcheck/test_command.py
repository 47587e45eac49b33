"""``runmgr health-check`` as people run it: a check whose mount hangs (bounded,
reported, the Kubernetes node labelled and, asked with --k8s-taint, tainted),
and bad input (one line, exit 2). The newcomer's check (no arguments, the
readable table) runs on a busy machine in test_shared_host.py: one local Ray
of three nodes for both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runmgr.healthcheck.k8s import HEALTH_LABEL, TAINT_KEY
from tests import cli
from tests.runmgr.healthcheck.fake_k8s import FakeKubernetes

ROOT = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("hung_mount_run.py")


def runmgr(*args: str, cwd: Path, timeout: float = 540):  # a limit on waiting, not on speed
    return cli.runmgr(*args, cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("args, expected", [
    (["health.storage.mounts=[{path: mnt/x}]"], "health.storage.mounts[0].path: must be an absolute path"),
    (["health.collectives.group_size=1"], "health.collectives.group_size: must be >= 2"),
    (["health.fleet.warn_relative=0.9"], "need 0 < warn_relative <= exclude_relative < 1"),
    (["health.nosuch=1"], "unknown config key 'health.nosuch'"),
    (["conf=demo", "conf=run12"], "name at most one config"),
    (["cluster.address=127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
    (["--k8s-taint"], "--k8s-taint needs --k8s-label"),
    (["--readmit", "GPU_07"], "--readmit: 'GPU_07' is not a Kubernetes node name"),
    (["--readmit", "gpu-07", "--k8s-label"], "--readmit clears marks by hand and checks nothing: drop --k8s-label"),
    (["--readmit", "conf=demo"], "--readmit needs the Kubernetes node(s) to readmit"),
    (["--recheck-self", "--k8s-label", "--k8s-taint"], "--recheck-self keeps or clears the marks its node"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, expected, tmp_path):
    result = runmgr("health-check", *args, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert expected in lines[0] and "Traceback" not in result.stderr


def can_mount_fuse_in_a_namespace() -> bool:
    if shutil.which("unshare") is None or not os.path.exists("/dev/fuse"):
        return False
    return subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                          capture_output=True, timeout=10).returncode == 0


@pytest.mark.skipif(not can_mount_fuse_in_a_namespace(), reason="needs unshare -m and /dev/fuse (root)")
def test_a_hung_mount_ends_at_its_timeout_and_the_node_is_labelled(tmp_path):
    mount = tmp_path / "hpfs"
    mount.mkdir()
    spec = f"health.storage.mounts=[{{path: '{mount}', fstype: fuse, min_free_gb: 0}}]"
    with FakeKubernetes({"npu-node-17": {}}) as k8s:
        result = subprocess.run(
            ["unshare", "-m", "--propagation", "private", sys.executable, str(HELPER), str(mount),
             # The deadline counts from the probe's first line, "stat", whose stat never returns on the
             # hung mount: any deadline ends in the same verdict, 1 s is only the test's wait.
             "health-check", spec, "health.storage.timeout_s=1", "cluster.local_nodes=1", "--json",
             "health.compute.matmul_size=256", "health.compute.bandwidth_mb=8",  # small: the mount is the story
             "--k8s-label", "--k8s-taint", "--k8s-host", k8s.url],
            cwd=tmp_path, capture_output=True, text=True, timeout=540,
            env={**os.environ, "RUNMGR_K8S_NODE_NAME": "npu-node-17", "PYTHONPATH": str(ROOT)})
        assert result.returncode == 1, result.stderr[-3000:]  # a node was excluded
        report = json.loads(result.stdout)
        assert len(report["nodes"]) == 1 and set(report["excluded"]) == {report["nodes"][0]["node"]}
        for reasons in report["excluded"].values():
            assert any(f"{mount}: the probe hung in stat and was stopped after 1 s" in r for r in reasons), reasons
        node = k8s.nodes["npu-node-17"]
        assert node["metadata"]["labels"][HEALTH_LABEL] == "excluded"
        assert [t["key"] for t in node["spec"]["taints"]] == [TAINT_KEY]
        assert {(a["k8s_node"], a["action"]) for a in report["k8s"]} == {("npu-node-17", "excluded")}


def test_recheck_self_outside_kubernetes_is_one_line_and_exit_code_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RUNMGR_K8S_NODE_NAME", "NODE_NAME")}
    result = cli.runmgr("health-check", "--recheck-self", "--k8s-label", cwd=tmp_path, env=env, timeout=540)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--recheck-self checks the Kubernetes node it runs on: set RUNMGR_K8S_NODE_NAME" in lines[0]
