"""What the RayCluster of each overlay asks of Kubernetes: a small pod of its
own for the driver (the head: no accelerator, no rank, off the training
nodes), the devices of the worker pods and how Ray learns of them, the nodes
they may land on (never one ``runmgr health-check --k8s-label`` marked), the
host's Ascend tools where runmgr's probes look for them, the volumes, the
environment (the driver's namespace and RayCluster included), and where the
secrets come from."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from health.config import DeviceChecks
from health.findings import Severity
from health.probes.devices import probe_devices
from runmgr.config.kubernetes import NAMESPACE_ENV, RAY_CLUSTER_ENV
from runmgr.healthcheck.k8s import HEALTH_LABEL, TAINT_KEY
from runmgr.healthcheck.node_task import K8S_NODE_ENV
from tests.k8s.manifests import (K8S, OVERLAYS, ROOT, config_map_data, containers, env_value, head_group,
                                 holds_ranks, mount_at, of_kind, one, pod_templates, rank_groups, rayjob, render,
                                 vendor_resources, volume, worker_groups)

DEVICE_RESOURCES = {"gpu": "nvidia.com/gpu", "npu": "huawei.com/Ascend910"}
"""Worker group name -> the device plugin's resource its pods request (cpu: none)."""
DEVICES_PER_NODE = 8
"""The accelerators of one training node: every accelerator pod holds a whole node's."""
COLLECTIVE_KEYS = {"gpu": {"NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS"},
                   "npu": {"HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_ASYNC_ERROR_HANDLING"},
                   "cpu": {"GLOO_SOCKET_IFNAME"}}
ACCELERATOR_NODE_LABELS = {"nvidia.com/gpu.present", "accelerator", "node.kubernetes.io/npu.chip.name"}
"""The node labels the worker groups choose accelerator nodes by (GPU feature discovery, Ascend's)."""
ASCEND_HOST_PATHS = ("/usr/local/Ascend/driver", "/usr/local/sbin", "/usr/local/dcmi", "/etc/ascend_install.info")
"""Where the Ascend driver's installer puts the driver, npu-smi, DCMI and the install record."""
ASCEND_TOOLS = {"npu-smi": "/usr/local/sbin", "hccn_tool": "/usr/local/Ascend/driver/tools"}
"""The tools runmgr's device probe calls (health/probes/devices.py), and where the driver installs them."""
IMAGES = (ROOT / "Dockerfile", K8S / "image" / "Dockerfile")
"""runmgr's own image and the recipe on the user's base."""
DRIVER_POD_MAX = {"cpu": 8, "memory_gi": 32}
"""A small pod: the driver, Ray's GCS and the metrics, never a training node's share."""


def group_of(overlay: str) -> dict:
    (group,) = worker_groups(rayjob(render(overlay)))  # one worker group per device kind
    return group


def device_kind(overlay: str) -> str:
    return group_of(overlay)["groupName"]


def accelerator_overlays() -> list[str]:
    return [o for o in OVERLAYS if device_kind(o) in DEVICE_RESOURCES]


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


def quantity_gi(text: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024, "Ti": 1024.0}
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Gi|Mi|Ti)", text).groups()
    return float(number) * units[unit]


def image_path(dockerfile: Path, base_path: str = "") -> list[str]:
    """The PATH an image's ENV sets, with the base image's PATH as ``base_path``."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    path = base_path
    for line in text.splitlines():
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                name, _, value = item.partition("=")
                if name == "PATH":
                    path = re.sub(r"\$\{PATH\}|\$PATH", path, value)
    return [d for d in path.split(":") if d]


def case_pattern(words: str) -> str:
    """A shell ``case`` pattern matching ``words`` literally, ``*`` as a wildcard."""
    return "*".join(shlex.quote(part) if part else "" for part in words.split("*"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_head_is_the_driver_s_small_pod_and_holds_no_rank(overlay):
    """The driver alone on the head: Ray sees no CPU and no GPU there (no rank,
    no actor that asks for either lands on it), its pod asks for no
    accelerator and for a few CPUs, it tolerates none of the accelerator
    pools' taints and prefers nodes without accelerator labels; every rank is
    on the worker group."""
    job = rayjob(render(overlay))
    head = head_group(job)
    assert not holds_ranks(head) and head["rayStartParams"] == {"num-cpus": "0", "num-gpus": "0"}
    assert set(rank_groups(job)) == {g["groupName"] for g in worker_groups(job)}
    (container,) = head["template"]["spec"]["containers"]
    assert vendor_resources(container) == {}
    assert not any("/" in k for k in container["resources"]["requests"])
    assert float(container["resources"]["limits"]["cpu"]) <= DRIVER_POD_MAX["cpu"]
    assert quantity_gi(container["resources"]["limits"]["memory"]) <= DRIVER_POD_MAX["memory_gi"]
    spec = head["template"]["spec"]
    assert not spec.get("tolerations")
    required = {e["key"] for t in node_terms(head) for e in t["matchExpressions"]}
    assert required == {HEALTH_LABEL}  # no accelerator label required
    (preferred,) = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    avoided = {e["key"]: e["operator"] for e in preferred["preference"]["matchExpressions"]}
    assert avoided == {"nvidia.com/gpu.present": "NotIn", "accelerator": "NotIn",
                       "node.kubernetes.io/npu.chip.name": "DoesNotExist"}
    # No host driver or tool (a CPU node has none); the shared file system may be the host's own mount.
    assert not [v["name"] for v in spec["volumes"] if "hostPath" in v and v["name"] != "shared"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rank_pods_request_their_devices_and_ray_sees_them(overlay):
    """Accelerator overlays: each worker pod a whole node of 8 GPUs or NPUs,
    requests equal to limits, and Ray told of the NPUs (KubeRay maps only
    *gpu itself)."""
    kind = device_kind(overlay)
    for name, group in rank_groups(rayjob(render(overlay))).items():
        (container,) = group["template"]["spec"]["containers"]
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        vendor = vendor_resources(container)
        if kind in DEVICE_RESOURCES:
            assert vendor == {DEVICE_RESOURCES[kind]: str(DEVICES_PER_NODE)}, name
        else:
            assert vendor == {}, name
        assert all(requests.get(k) == limits[k] for k in vendor)  # extended resources: requests equal limits
        if kind == "npu":
            assert ray_resources(group) == {"NPU": DEVICES_PER_NODE}, name
        else:
            assert "NPU" not in ray_resources(group)


def test_every_accelerator_overlay_is_checked():
    assert {"gpu", "npu", "megatron-gpu", "mindspeed-npu"} <= set(accelerator_overlays())


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
        assert set().union(*chosen_by) <= ACCELERATOR_NODE_LABELS  # what the head's preference avoids
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
            assert "storageClassName" not in claim["spec"]  # generic: k8s/components/storage-class sets it


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o.startswith("npu") or o.startswith("mindspeed")])
def test_ascend_pods_see_the_host_driver_and_its_tools_read_only(overlay):
    """The worker pods mount the host's driver, npu-smi's directory, DCMI and
    the install record where the driver's installer puts them, read-only; no
    mount is a single file a host may lack (a hostPath of type File that is
    missing keeps the pod from ever starting)."""
    for name, group in rank_groups(rayjob(render(overlay))).items():
        template = group["template"]
        (container,) = template["spec"]["containers"]
        for path in ASCEND_HOST_PATHS:
            mount = mount_at(container, path)
            assert mount is not None and mount.get("readOnly") is True, (name, path)
            assert volume(template, mount["name"])["hostPath"]["path"] == path
        host_paths = [v["hostPath"] for v in template["spec"]["volumes"] if "hostPath" in v]
        assert not [h for h in host_paths if h.get("type") == "File"], (name, host_paths)


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o.startswith("npu") or o.startswith("mindspeed")])
@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_ascend_tools_are_mounted_where_runmgr_s_probe_looks(overlay, dockerfile):
    """The probe finds npu-smi and hccn_tool on the PATH: each tool's install
    directory is inside a host mount at the same path and on the image's PATH."""
    path = image_path(dockerfile)
    (container,) = group_of(overlay)["template"]["spec"]["containers"]
    for tool, directory in ASCEND_TOOLS.items():
        mounts = [m["mountPath"] for m in container["volumeMounts"]
                  if directory == m["mountPath"] or directory.startswith(m["mountPath"] + "/")]
        assert mounts, (tool, directory)
        assert directory in path, (tool, dockerfile.name, path)


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_probe_finds_the_host_s_tools_on_the_image_s_path(dockerfile, tmp_path):
    """runmgr's device probe, run with the image's PATH over a copy of the
    host's layout (npu-smi in /usr/local/sbin, hccn_tool in the driver's
    tools), sees the node's 8 NPUs and checks their RoCE links."""
    fixtures = ROOT / "tests" / "health" / "fixtures"
    answers = {"npu-smi": [("info", "npu_smi/info_910b_ok.txt"), ("info -t health -i *", "npu_smi/health_ok.txt"),
                           ("info -t ecc -i *", "npu_smi/ecc_910b_ok.txt")],
               "hccn_tool": [("-i * -link -g", "hccn_tool/link_up.txt"),
                             ("-i * -net_health -g", "hccn_tool/net_health_ok.txt")]}
    for tool, directory in ASCEND_TOOLS.items():
        script = tmp_path / directory.lstrip("/") / tool
        script.parent.mkdir(parents=True, exist_ok=True)
        cases = "".join(f"    {case_pattern(pattern)}) exec /bin/cat {fixtures / answer};;\n"
                        for pattern, answer in answers[tool])
        script.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}esac\nexit 1\n')
        script.chmod(0o755)
    path = ":".join(str(tmp_path / d.lstrip("/")) for d in image_path(dockerfile))
    result = probe_devices(DeviceChecks(expected_devices=DEVICES_PER_NODE), path=path)
    assert result.facts["accelerator"] == "npu" and result.facts["device_count"] == DEVICES_PER_NODE
    assert not [f for f in result.findings if f.severity is Severity.FAIL]
    assert "roce.link.up" in {f.code for f in result.findings}


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
def test_the_driver_knows_its_namespace_and_raycluster(overlay):
    """The variables runmgr's driver reads (runmgr/config/kubernetes.py) to
    patch its own RayCluster, from the downward API: KubeRay labels every pod
    of a cluster ray.io/cluster=NAME."""
    (head,) = head_group(rayjob(render(overlay)))["template"]["spec"]["containers"]
    assert env_value(head, NAMESPACE_ENV)["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env_value(head, RAY_CLUSTER_ENV)["valueFrom"] == \
        {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}


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
