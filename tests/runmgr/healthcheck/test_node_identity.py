"""Which machine a Ray node runs on, as each node's probe reports it: what the
fleet rule uses to tell nodes that compete for one machine's cores from
nodes on machines of their own."""

from __future__ import annotations

import pytest

from health.fleet import HOST_FACT
from runmgr.healthcheck.node_task import host_id, identity_facts


@pytest.mark.parametrize("case, environ, boot_id, expected", [
    ("raylets or pods of one machine share the kernel's boot id", {}, "867ae481-e9dc", "boot:867ae481-e9dc"),
    ("pods: the boot id, not the pod's own host name", {"RUNMGR_K8S_NODE_NAME": "gpu-07"}, "b1", "boot:b1"),
    ("no boot id readable: the Kubernetes node", {"NODE_NAME": "gpu-07"}, None, "k8s:gpu-07"),
    ("said explicitly", {"RUNMGR_HOST_ID": "rack3-u12", "NODE_NAME": "gpu-07"}, "b1", "env:rack3-u12"),
    ("nothing tells: a host of its own", {}, None, None),
])
def test_host_id(case, environ, boot_id, expected, tmp_path):
    boot_file = tmp_path / "boot_id"
    if boot_id:
        boot_file.write_text(boot_id + "\n")
    assert host_id(environ, boot_file) == expected, case


def test_identity_facts_carry_the_machine_and_the_kubernetes_node(tmp_path):
    boot_file = tmp_path / "boot_id"
    boot_file.write_text("b1\n")
    facts = identity_facts({"RUNMGR_K8S_NODE_NAME": "gpu-07", "KUBERNETES_SERVICE_HOST": "10.0.0.1"},
                           "runmgr-gpu-worker-x1", tmp_path / "namespace", boot_file)
    assert facts == {"node.hostname": "runmgr-gpu-worker-x1", "node.boot_id": "b1", HOST_FACT: "boot:b1",
                     "k8s.node_name": "gpu-07", "k8s.pod": "runmgr-gpu-worker-x1", "k8s.namespace": None}
