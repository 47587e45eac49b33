"""What the RayCluster of each overlay asks of Kubernetes: the devices of its
pods and how Ray learns of them, the nodes it may land on (never one
``runmgr health-check --k8s-label`` marked), its volumes, its environment,
and where its secrets come from."""

from __future__ import annotations

import json

import pytest

from runmgr.healthcheck.k8s import HEALTH_LABEL, TAINT_KEY
from runmgr.healthcheck.node_task import K8S_NODE_ENV
from tests.k8s.manifests import (K8S, OVERLAYS, config_map_data, containers, env_value, head_group, holds_ranks,
                                 mount_at, of_kind, one, pod_templates, rank_groups, rayjob, render, volume,
                                 worker_groups)

DEVICE_RESOURCES = {"gpu": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
"""Worker group name -> the device plugin's resource its pods request (cpu: none)."""
COLLECTIVE_KEYS = {"gpu": {"NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS"},
                   "npu": {"HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_ASYNC_ERROR_HANDLING"},
                   "cpu": {"GLOO_SOCKET_IFNAME"}}
ASCEND_HOST_PATHS = ("/usr/local/Ascend/driver", "/usr/local/bin/npu-smi")


def group_of(overlay: str) -> dict:
    (group,) = worker_groups(rayjob(render(overlay)))  # one worker group per device kind
    return group


def device_kind(overlay: str) -> str:
    return group_of(overlay)["groupName"]


def node_terms(group: dict) -> list[dict]:
    affinity = group["template"]["spec"]["affinity"]["nodeAffinity"]
    return affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def ray_resources(group: dict) -> dict[str, float]:
    """rayStartParams.resources as Ray reads it: a quoted JSON string, '"{\\"NPU\\": 8}"'."""
    text = group["rayStartParams"].get("resources")
    if text is None:
        return {}
    assert text.startswith('"') and text.endswith('"'), f"KubeRay needs the JSON quoted: {text!r}"
    return json.loads(text[1:-1].replace('\\"', '"'))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rank_pods_request_their_devices_and_ray_sees_them(overlay):
    kind = device_kind(overlay)
    groups = rank_groups(rayjob(render(overlay)))
    assert kind in groups
    for name, group in groups.items():
        (container,) = group["template"]["spec"]["containers"]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        vendor = {k for k in limits if "/" in k}
        assert vendor == ({DEVICE_RESOURCES[kind]} if kind in DEVICE_RESOURCES else set()), name
        assert all(requests.get(k) == limits[k] for k in vendor)  # extended resources: requests equal limits
        if kind == "npu":
            # KubeRay maps only *gpu resources itself: the NPUs are advertised by hand, as many as requested.
            assert ray_resources(group) == {"NPU": int(limits["huawei.com/Ascend910"])}, name
        else:
            assert "NPU" not in ray_resources(group)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_head_is_a_node_like_the_workers_or_holds_no_ranks(overlay):
    """runmgr's health check compares every Ray node with the others: on a
    device cluster a head without devices would be the odd one out (and be
    excluded, its node labelled). The laptop's head runs the driver alone."""
    job = rayjob(render(overlay))
    head, worker = head_group(job), group_of(overlay)
    if device_kind(overlay) in DEVICE_RESOURCES:
        assert holds_ranks(head)
        for part in (lambda g: g["rayStartParams"], lambda g: g["template"]["spec"]["containers"][0]["resources"],
                     node_terms, lambda g: g["template"]["spec"].get("tolerations")):
            assert part(head) == part(worker)
    else:
        assert not holds_ranks(head) and holds_ranks(worker)
        assert not any("/" in k for k in head["template"]["spec"]["containers"][0]["resources"]["limits"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_lands_on_a_node_the_health_check_excluded(overlay):
    for group, template in pod_templates(rayjob(render(overlay))).items():
        spec = template["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        keep_off = {"key": HEALTH_LABEL, "operator": "NotIn", "values": ["excluded"]}
        # Terms are ORed: each must keep off the label, or one would let a marked node in.
        assert terms and all(keep_off in term["matchExpressions"] for term in terms), group
        for toleration in spec.get("tolerations", []):
            assert toleration.get("key") not in (None, "", TAINT_KEY), (group, toleration)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_device_nodes_are_chosen_by_the_vendors_labels(overlay):
    kind = device_kind(overlay)
    expected = {"gpu": [{"nvidia.com/gpu.present": ["true"]}],
                "npu": [{"accelerator": ["huawei-Ascend910"]}, {"node.kubernetes.io/npu.chip.name": None}],
                "cpu": [{}]}
    for name, group in rank_groups(rayjob(render(overlay))).items():
        chosen_by = [{e["key"]: e.get("values") for e in t["matchExpressions"] if e["key"] != HEALTH_LABEL}
                     for t in node_terms(group)]
        assert chosen_by == expected[kind], name
        tolerated = {t["key"] for t in group["template"]["spec"].get("tolerations", [])}
        assert tolerated == ({"nvidia.com/gpu"} if kind == "gpu" else set()), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_mounts_the_shared_file_system_and_a_memory_shm(overlay):
    docs = render(overlay)
    for group, template in pod_templates(rayjob(docs)).items():
        (container,) = template["spec"]["containers"]
        assert mount_at(container, "/shared")["name"] == "shared"
        shm = volume(template, mount_at(container, "/dev/shm")["name"])
        assert shm["emptyDir"]["medium"] == "Memory", group
        shared = volume(template, "shared")
        if overlay.endswith("hostpath"):
            assert shared["hostPath"]["type"] == "Directory" and not of_kind(docs, "PersistentVolumeClaim")
        else:
            claim = one(docs, "PersistentVolumeClaim", shared["persistentVolumeClaim"]["claimName"])
            assert claim["spec"]["accessModes"] == (["ReadWriteOnce"] if overlay == "cpu" else ["ReadWriteMany"])


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o.startswith("npu")])
def test_ascend_pods_see_the_host_driver_read_only(overlay):
    for name, group in rank_groups(rayjob(render(overlay))).items():
        template = group["template"]
        (container,) = template["spec"]["containers"]
        for path in ASCEND_HOST_PATHS:
            mount = mount_at(container, path)
            assert mount is not None and mount.get("readOnly") is True, (name, path)
            assert volume(template, mount["name"])["hostPath"]["path"] == path


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_the_ray_and_collective_environment(overlay):
    docs = render(overlay)
    collectives = config_map_data(docs, "runmgr-collectives")
    assert COLLECTIVE_KEYS[device_kind(overlay)] <= set(collectives)
    for group, template in pod_templates(rayjob(docs)).items():
        for container in containers(template):
            assert env_value(container, "RAY_worker_niceness") == {"name": "RAY_worker_niceness", "value": "0"}
            node = [env_value(container, name) for name in K8S_NODE_ENV if env_value(container, name)]
            assert [e["valueFrom"]["fieldRef"]["fieldPath"] for e in node] == ["spec.nodeName"], group
            sources = container.get("envFrom", [])
            assert {"configMapRef": {"name": "runmgr-collectives"}} in sources, group


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_s3_credentials_come_only_from_the_runmgr_s3_secret(overlay):
    docs = render(overlay)
    assert not of_kind(docs, "Secret")  # created by the user (README), never committed
    for config_map in of_kind(docs, "ConfigMap"):
        text = json.dumps(config_map.get("data", {}))
        assert "AWS_ACCESS_KEY_ID" not in text and "AWS_SECRET_ACCESS_KEY" not in text, config_map["metadata"]
    for group, template in pod_templates(rayjob(docs)).items():
        (container,) = template["spec"]["containers"]
        secrets = [s["secretRef"] for s in container.get("envFrom", []) if "secretRef" in s]
        assert [s["name"] for s in secrets] == ["runmgr-s3"], group
        assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in container.get("env", []))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grafana_dashboard_is_a_configmap_the_sidecar_loads(overlay):
    dashboard = one(render(overlay), "ConfigMap", "runmgr-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    assert text == (K8S / "base" / "grafana" / "runmgr-dashboard.json").read_text()
    assert json.loads(text)["title"]
