"""The optional kustomize components of k8s/components/, each rendered on top
of every overlay it is meant for, in a run's kustomization as a user writes
it (k8s/runs/NAME: the overlay as a resource, the components listed):
every document that comes out validates offline (built-in kinds with
kubernetes-validate --strict, custom kinds against their CRD's schema under
tests/k8s/schemas/; none escapes), and each component does what a user turns
it on for, and nothing to the pods it is not for (the head, the driver's
pod, never asks for an accelerator or RDMA)."""

from __future__ import annotations

import copy
from pathlib import PurePosixPath
from typing import Iterator, Optional

import kubernetes_validate
import pytest
import yaml

from runmgr.cli import build_parser
from runmgr.metrics.alerts import rule_groups
from tests.k8s.crd_schema import CRD_FILES, crd_errors
from tests.k8s.manifests import (K8S, KUBERNETES_VERSION, OVERLAYS, config_map_data, containers, head_group, of_kind,
                                 one, pod_templates, ray_cluster, render, render_dir, worker_groups)

COMPONENTS = K8S / "components"
GPU_OVERLAYS = tuple(o for o in OVERLAYS if "gpu" in o)
NPU_OVERLAYS = tuple(o for o in OVERLAYS if "npu" in o)
MEANT_FOR = {
    "rdma-gpu": GPU_OVERLAYS,
    "rdma-multus": GPU_OVERLAYS,
    "hccl-npu": NPU_OVERLAYS,
    "kueue": OVERLAYS,
    "volcano": OVERLAYS,
    "priority": OVERLAYS,
    "pdb": OVERLAYS,
    "storage-class": OVERLAYS,
    "servicemonitor": OVERLAYS,
    "alerts": OVERLAYS,
    "logbook-page": OVERLAYS,
}
"""Component -> the overlays it applies on top of (k8s/overlays/NAME)."""
CASES = [(component, overlay) for component, overlays in MEANT_FOR.items() for overlay in overlays]
TOGETHER = {"gpu": ("rdma-gpu", "rdma-multus", "priority", "volcano", "pdb", "storage-class", "servicemonitor",
                     "alerts", "logbook-page"),
            "npu": ("hccl-npu", "priority", "kueue", "pdb", "storage-class", "servicemonitor", "alerts",
                    "logbook-page")}
"""Components a run may list together (kueue and volcano exclude each other), by device."""

RDMA = "rdma/rdma_shared_device_a"
ACCELERATORS = ("nvidia.com/", "huawei.com/", "amd.com/", "rdma/")
RUN_LABEL = "runmgr.io/run"


# ---- rendering -------------------------------------------------------------------------------------------------------

def run_kustomization(overlay: str, components: tuple[str, ...], name: Optional[str] = None) -> str:
    """k8s/runs/NAME/kustomization.yaml as a user writes it: the overlay, the
    components, and for a run among others its name suffix and label."""
    text = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [f"../../overlays/{overlay}"],
            "components": [f"../../components/{c}" for c in components]}
    if name:
        text["nameSuffix"] = f"-{name}"
        text["labels"] = [{"pairs": {RUN_LABEL: name}, "includeSelectors": True}]
    return yaml.safe_dump(text, sort_keys=False)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``build(overlay, components, name=None)``: the documents of that run's
    kustomization, rendered in a copy of k8s/'s layout (its folders linked)
    under a temporary folder, once per module."""
    root = tmp_path_factory.mktemp("k8s")
    for part in ("base", "overlays", "components"):
        (root / part).symlink_to(K8S / part, target_is_directory=True)
    cache: dict = {}

    def _build(overlay: str, components: tuple[str, ...], name: Optional[str] = None) -> tuple[dict, ...]:
        key = (overlay, tuple(components), name)
        if key not in cache:
            directory = root / "runs" / f"run{len(cache)}"
            directory.mkdir(parents=True)
            (directory / "kustomization.yaml").write_text(run_kustomization(overlay, tuple(components), name))
            cache[key] = render_dir(directory)
        return copy.deepcopy(cache[key])

    return _build


# ---- validation ------------------------------------------------------------------------------------------------------

def builtin_errors(doc: dict) -> Optional[list[str]]:
    """kubernetes-validate --strict on one document: its errors, or None when
    it holds no schema of the kind (not a built-in kind)."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return None
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path) or "(top)"
        return [f"{doc['kind']} {doc['metadata']['name']}: {where}: {error.message}"]
    return []


def validation_errors(doc: dict) -> list[str]:
    """Every document is a built-in kind or a kind with a CRD schema here; a
    RayJob's RayCluster (what KubeRay creates from it) is checked too."""
    group = doc["apiVersion"].rpartition("/")[0]
    if (group, doc["kind"]) in CRD_FILES:
        errors = crd_errors(doc)
        if doc["kind"] == "RayJob":
            errors += crd_errors(ray_cluster(doc))
        return errors
    errors = builtin_errors(doc)
    if errors is None:
        return [f"{doc['apiVersion']} {doc['kind']} {doc['metadata']['name']}: no schema to validate it against "
                f"(add its CRD under tests/k8s/schemas/ and to crd_schema.CRD_FILES)"]
    return errors


# ---- what the pods look like -----------------------------------------------------------------------------------------

def the_rayjob(docs) -> dict:
    (job,) = of_kind(docs, "RayJob")
    return job


def worker_templates(job: dict) -> dict[str, dict]:
    return {group["groupName"]: group["template"] for group in worker_groups(job)}


def resource_names(container: dict) -> set[str]:
    resources = container.get("resources", {})
    return set(resources.get("requests", {})) | set(resources.get("limits", {}))


def capabilities(container: dict) -> set[str]:
    return set(container.get("securityContext", {}).get("capabilities", {}).get("add", []))


def env_of(container: dict, name: str) -> Optional[dict]:
    return next((e for e in container.get("env", []) if e["name"] == name), None)


def pods_of(job: dict) -> Iterator[tuple[str, dict]]:
    """The labels of the pods KubeRay creates from the RayJob's groups (one per
    replica): the template's labels plus KubeRay's own (common/pod.go labelPod:
    the template's win, except ray.io/node-type, ray.io/group, ray.io/cluster),
    with the namespace under the key ``namespace`` (not a label)."""
    cluster = f"{job['metadata']['name']}-xxxxx"  # KubeRay names the RayJob's cluster NAME-<5 random>
    groups = [("head", "head", 1, head_group(job)["template"])] + [
        ("worker", g["groupName"], g.get("replicas", 1), g["template"]) for g in worker_groups(job)]
    for node_type, group, replicas, template in groups:
        labels = {"ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay",
                  "app.kubernetes.io/created-by": "kuberay-operator",
                  **template["metadata"].get("labels", {}),
                  "ray.io/node-type": node_type, "ray.io/group": group, "ray.io/cluster": cluster}
        for _ in range(replicas):
            yield group, {**labels, "namespace": job["metadata"]["namespace"]}


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels only, as ours are) selects these labels."""
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    return selector["matchLabels"].items() <= labels.items()


# ---- every component, every overlay it is meant for ------------------------------------------------------------------

def test_every_component_here_is_one_and_says_what_it_does():
    for component in MEANT_FOR:
        path = COMPONENTS / component / "kustomization.yaml"
        text = path.read_text()
        assert text.startswith("# "), f"{path}: begins with a comment saying what it does"
        header = text.split("\napiVersion:")[0]
        for needed in ("The cluster needs:", "Turn it on", "components: [", f"../../components/{component}"):
            assert needed in header, f"{path}: its header says {needed!r}"
        doc = yaml.safe_load(text)
        assert (doc["apiVersion"], doc["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component"), path


def test_the_overlays_are_sorted_by_their_devices():
    """GPU_OVERLAYS and NPU_OVERLAYS (by name) are the overlays whose workers
    ask for NVIDIA GPUs and Ascend NPUs, so every such overlay is covered."""
    for overlay in OVERLAYS:
        asked = {name for t in worker_templates(the_rayjob(render(overlay))).values() for c in containers(t)
                 for name in resource_names(c)}
        assert ("nvidia.com/gpu" in asked) == (overlay in GPU_OVERLAYS), overlay
        assert any(n.startswith("huawei.com/Ascend") for n in asked) == (overlay in NPU_OVERLAYS), overlay


@pytest.mark.parametrize("component, overlay", CASES)
def test_the_component_renders_on_the_overlay_and_every_document_validates(build, component, overlay):
    docs = build(overlay, (component,))
    assert any(doc["kind"] == "RayJob" for doc in docs)
    errors = [line for doc in docs for line in validation_errors(doc)]
    assert errors == []


@pytest.mark.parametrize("overlay", GPU_OVERLAYS + NPU_OVERLAYS)
def test_a_run_with_every_component_it_can_take_validates(build, overlay):
    components = TOGETHER["gpu" if overlay in GPU_OVERLAYS else "npu"]
    docs = build(overlay, components, "a")
    errors = [line for doc in docs for line in validation_errors(doc)]
    assert errors == []
    job = the_rayjob(docs)
    for group, template in pod_templates(job).items():
        assert template["metadata"]["labels"][RUN_LABEL] == "a", group
    # Each component's objects are there, in the run's namespace, with its suffix.
    namespaced = [d for d in docs if d["kind"] in {"PodDisruptionBudget", "Deployment", "Service", "ServiceMonitor",
                                                   "PrometheusRule", "LocalQueue", "PersistentVolumeClaim",
                                                   "ConfigMap"}]
    assert {d["metadata"].get("namespace") for d in namespaced} == {job["metadata"]["namespace"]}
    assert all(d["metadata"]["name"].endswith("-a") for d in docs)


@pytest.mark.parametrize("component, overlay", CASES)
def test_the_head_never_asks_for_an_accelerator_or_rdma(build, component, overlay):
    job = the_rayjob(build(overlay, (component,)))
    for container in containers(head_group(job)["template"]):
        assert not [r for r in resource_names(container) if r.startswith(ACCELERATORS)], container["name"]
        assert "IPC_LOCK" not in capabilities(container)
    assert "k8s.v1.cni.cncf.io/networks" not in head_group(job)["template"]["metadata"].get("annotations", {})


@pytest.mark.parametrize("component, overlay", CASES)
def test_no_pod_names_a_volume_or_a_mount_path_twice(build, component, overlay):
    """A component adds volumes and mounts by name: one the overlay already
    has by another name would make every pod of the group invalid."""
    for group, template in pod_templates(the_rayjob(build(overlay, (component,)))).items():
        names = [v["name"] for v in template["spec"].get("volumes", [])]
        assert len(names) == len(set(names)), (group, names)
        for container in containers(template):
            paths = [m["mountPath"] for m in container.get("volumeMounts", [])]
            assert len(paths) == len(set(paths)), (group, container["name"], paths)
            assert {m["name"] for m in container.get("volumeMounts", [])} <= set(names)


def test_an_unknown_field_of_a_component_s_custom_kind_fails_validation(build):
    docs = build("gpu", ("kueue", "servicemonitor"))
    queue = copy.deepcopy(one(docs, "LocalQueue"))
    queue["spec"]["clusterqueue"] = queue["spec"].pop("clusterQueue")  # misspelt: Kueue would drop it
    assert any("'clusterqueue' was unexpected" in e for e in validation_errors(queue))
    monitor = copy.deepcopy(one(docs, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["ports"] = monitor["spec"]["endpoints"][0].pop("port")
    assert any("'ports' was unexpected" in e for e in validation_errors(monitor))
    settings = {"apiVersion": "runmgr.io/v1alpha1", "kind": "ComponentSettings", "metadata": {"name": "x"}}
    assert "no schema to validate it against" in validation_errors(settings)[0]


# ---- rdma-gpu, rdma-multus -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_rdma_gpu_gives_every_worker_the_rdma_device_and_ipc_lock(build, overlay):
    job = the_rayjob(build(overlay, ("rdma-gpu",)))
    for group, template in worker_templates(job).items():
        for container in template["spec"]["containers"]:
            resources = container["resources"]
            assert str(resources["requests"][RDMA]) == str(resources["limits"][RDMA]) == "1", (group, resources)
            assert "IPC_LOCK" in capabilities(container), group
        shm = next(v for v in template["spec"]["volumes"]
                   if any(m["name"] == v["name"] and m["mountPath"] == "/dev/shm"
                          for c in containers(template) for m in c.get("volumeMounts", [])))
        assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"].get("sizeLimit"), group


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_without_rdma_gpu_no_pod_asks_for_rdma(overlay):
    for group, template in pod_templates(the_rayjob(render(overlay))).items():
        for container in containers(template):
            assert RDMA not in resource_names(container) and "IPC_LOCK" not in capabilities(container), group


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_rdma_gpu_adds_nccl_s_ib_settings_to_the_collectives_and_keeps_the_overlay_s(build, overlay):
    docs = build(overlay, ("rdma-gpu",))
    before = config_map_data(render(overlay), "runmgr-collectives")
    after = config_map_data(docs, "runmgr-collectives")
    added = {"NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_NET_GDR_LEVEL", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE"}
    assert added <= set(after)
    assert set(before) <= set(after)
    assert after["NCCL_IB_DISABLE"] == "0" and after["NCCL_NET_GDR_LEVEL"] in {"LOC", "PIX", "PXB", "PHB", "SYS"}
    assert int(after["NCCL_IB_GID_INDEX"]) >= 0
    # ... and every worker reads that ConfigMap.
    for group, template in worker_templates(the_rayjob(docs)).items():
        for container in template["spec"]["containers"]:
            refs = [e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e]
            assert "runmgr-collectives" in refs, group


@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_rdma_multus_attaches_the_rdma_network_to_the_workers_only(build, overlay):
    job = the_rayjob(build(overlay, ("rdma-gpu", "rdma-multus")))
    for group, template in worker_templates(job).items():
        assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net", group
    for template in pod_templates(the_rayjob(render(overlay))).values():
        assert "k8s.v1.cni.cncf.io/networks" not in template["metadata"].get("annotations", {})


# ---- hccl-npu --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", NPU_OVERLAYS)
def test_hccl_npu_gives_every_worker_its_own_ip_for_hccl_and_the_host_s_hccn_conf(build, overlay):
    docs = build(overlay, ("hccl-npu",))
    job = the_rayjob(docs)
    for group, template in worker_templates(job).items():
        spec = template["spec"]
        assert not spec.get("hostNetwork"), group  # the NPUs' RoCE is not the pod's network
        for container in spec["containers"]:
            assert env_of(container, "HCCL_IF_IP") == {"name": "HCCL_IF_IP",
                                                       "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/hccn.conf"]
            assert mount["readOnly"] is True
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            # Read-only from the host, and a node without one does not fail the pod (File would).
            assert volume["hostPath"] == {"path": "/etc/hccn.conf", "type": "FileOrCreate"}
        shm = [m for c in spec["containers"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert shm and all(next(v for v in spec["volumes"] if v["name"] == m["name"])["emptyDir"]["medium"] == "Memory"
                           for m in shm)
    head = head_group(job)["template"]
    assert "/etc/hccn.conf" not in {m["mountPath"] for c in containers(head) for m in c.get("volumeMounts", [])}
    data = config_map_data(docs, "runmgr-collectives")
    assert int(data["HCCL_CONNECT_TIMEOUT"]) >= 120 and int(data["HCCL_EXEC_TIMEOUT"]) >= 120
    assert data["HCCL_SOCKET_IFNAME"]
    assert set(config_map_data(render(overlay), "runmgr-collectives")) <= set(data)


# ---- kueue -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kueue_queues_the_rayjob_whole_in_a_localqueue_of_its_namespace(build, overlay):
    docs = build(overlay, ("kueue",))
    job = the_rayjob(docs)
    (queue,) = of_kind(docs, "LocalQueue")
    assert crd_errors(queue) == []
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue["metadata"]["name"]
    assert queue["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert queue["spec"]["clusterQueue"]
    # What Kueue's RayJob integration asks of the RayJob.
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    assert "clusterSelector" not in job["spec"] and 1 <= len(worker_groups(job)) <= 7
    assert "suspend" not in job["spec"]  # Kueue's webhook suspends it; a manifest's suspend would stop a re-apply


def test_kueue_each_run_s_label_names_its_own_localqueue(build):
    for name in ("a", "b"):
        docs = build("gpu", ("kueue",), name)
        (queue,) = of_kind(docs, "LocalQueue")
        assert queue["metadata"]["name"].endswith(f"-{name}")
        assert the_rayjob(docs)["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue["metadata"]["name"]


# ---- volcano ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_volcano_labels_the_rayjob_where_kuberay_reads_them(build, overlay):
    """KubeRay 1.5.1+ reads the RayJob's labels for its PodGroup; older ones
    copy them to the RayCluster they create (rayClusterSpec has no metadata)."""
    job = the_rayjob(build(overlay, ("volcano",)))
    labels = job["metadata"]["labels"]
    assert labels["ray.io/scheduler-name"] == "volcano"
    assert labels["volcano.sh/queue-name"] == "default"
    assert "metadata" not in job["spec"]["rayClusterSpec"]
    plain = the_rayjob(render(overlay))["metadata"].get("labels", {})
    assert not {"ray.io/scheduler-name", "volcano.sh/queue-name"} & set(plain)


def test_volcano_s_example_queue_validates_and_is_not_part_of_the_run(build):
    (queue,) = [d for d in yaml.safe_load_all((COMPONENTS / "volcano" / "queue.yaml").read_text()) if d]
    assert crd_errors(queue) == []
    assert queue["spec"]["reclaimable"] is False
    assert not of_kind(build("gpu", ("volcano",)), "Queue")


# ---- priority --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_priority_gives_the_head_and_every_worker_the_run_s_priorityclass(build, overlay):
    docs = build(overlay, ("priority",))
    (priority,) = of_kind(docs, "PriorityClass")
    assert builtin_errors(priority) == []
    assert priority["globalDefault"] is False and 0 < priority["value"] < 1_000_000_000
    job = the_rayjob(docs)
    names = {group: t["spec"].get("priorityClassName") for group, t in pod_templates(job).items()}
    assert set(names.values()) == {priority["metadata"]["name"]}, names
    assert job["metadata"]["labels"]["ray.io/priority-class-name"] == priority["metadata"]["name"]


def test_priority_follows_a_run_s_name_suffix(build):
    docs = build("gpu", ("priority",), "a")
    (priority,) = of_kind(docs, "PriorityClass")
    assert priority["metadata"]["name"].endswith("-a")
    job = the_rayjob(docs)
    assert {t["spec"]["priorityClassName"] for t in pod_templates(job).values()} == {priority["metadata"]["name"]}
    assert job["metadata"]["labels"]["ray.io/priority-class-name"] == priority["metadata"]["name"]


# ---- pdb -------------------------------------------------------------------------------------------------------------

def budgets_of_pods(docs, job: dict) -> list[tuple[str, list[dict]]]:
    """Each pod of the RayJob (its group) with the budgets that select it."""
    budgets = of_kind(docs, "PodDisruptionBudget")
    return [(group, [b for b in budgets if b["metadata"]["namespace"] == labels["namespace"]
                     and selects(b["spec"]["selector"], labels)])
            for group, labels in pods_of(job)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pdb_keeps_evictions_off_every_pod_of_the_run(build, overlay):
    docs = build(overlay, ("pdb",))
    job = the_rayjob(docs)
    selected = budgets_of_pods(docs, job)
    # Exactly one budget per pod: an eviction refuses a pod two budgets select.
    assert all(len(b) == 1 for _, b in selected), [(g, [x["metadata"]["name"] for x in b]) for g, b in selected]
    for budget in of_kind(docs, "PodDisruptionBudget"):
        assert builtin_errors(budget) == []
        assert "maxUnavailable" not in budget["spec"]  # a RayCluster has no scale subresource
        pods = [g for g, b in selected if budget in b]
        # minAvailable = every pod it selects: no voluntary eviction of a healthy one.
        assert budget["spec"]["minAvailable"] == len(pods) > 0, (budget["metadata"]["name"], pods)
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_pdb_selects_only_its_own_run_s_pods(build):
    runs = {name: build("gpu", ("pdb",), name) for name in ("a", "b")}
    for name, docs in runs.items():
        other = the_rayjob(runs["b" if name == "a" else "a"])
        for _, labels in pods_of(other):
            assert not [b for b in of_kind(docs, "PodDisruptionBudget") if selects(b["spec"]["selector"], labels)]
        assert all(len(b) == 1 for _, b in budgets_of_pods(docs, the_rayjob(docs)))


# ---- storage-class ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_storage_class_names_the_class_of_the_shared_claim_and_asks_for_readwritemany(build, overlay):
    docs = build(overlay, ("storage-class",))
    claims = of_kind(docs, "PersistentVolumeClaim")
    assert len(claims) == len(of_kind(render(overlay), "PersistentVolumeClaim"))  # none where the overlay has none
    for claim in claims:
        assert claim["spec"]["storageClassName"] == "shared-fs"
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    job = the_rayjob(docs)
    for group, template in pod_templates(job).items():
        for volume in template["spec"]["volumes"]:
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in {c["metadata"]["name"] for c in claims}, group


# ---- servicemonitor --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_servicemonitor_selects_the_metrics_service_and_names_its_port(build, overlay):
    docs = build(overlay, ("servicemonitor",))
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert crd_errors(monitor) == []
    services = [s for s in of_kind(docs, "Service") if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
                and s["metadata"]["namespace"] == monitor["metadata"]["namespace"]]
    assert [s["metadata"]["name"] for s in services] == ["runmgr-metrics"]
    service_ports = {p["name"]: p for p in services[0]["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["runmgr-metrics"]
    assert service_ports["runmgr-metrics"]["port"] == 8000
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert "release" in monitor["metadata"]["labels"]


def test_without_the_servicemonitor_component_no_overlay_needs_prometheus_operator():
    for overlay in OVERLAYS:
        assert not [d for d in render(overlay) if d["apiVersion"].startswith("monitoring.coreos.com/")], overlay


def test_each_run_s_servicemonitor_selects_only_its_own_metrics_service(build):
    runs = {name: build("gpu", ("servicemonitor",), name) for name in ("a", "b")}
    services = [s for docs in runs.values() for s in of_kind(docs, "Service")]
    for name, docs in runs.items():
        (monitor,) = of_kind(docs, "ServiceMonitor")
        selected = [s["metadata"]["name"] for s in services
                    if selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
        assert selected == [f"runmgr-metrics-{name}"]


# ---- alerts ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_alerts_component_carries_the_generated_rules_into_the_run_s_namespace(build, overlay):
    docs = build(overlay, ("servicemonitor", "alerts"))
    (rule,) = of_kind(docs, "PrometheusRule")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert crd_errors(rule) == []
    assert rule["metadata"]["namespace"] == monitor["metadata"]["namespace"]
    assert rule["metadata"]["labels"]["release"] == monitor["metadata"]["labels"]["release"]
    assert rule["spec"] == rule_groups()  # what runmgr.rules.yml holds for plain Prometheus


# ---- logbook-page ----------------------------------------------------------------------------------------------------

def run_dir(docs) -> PurePosixPath:
    """run.dir of the run's config (the ConfigMap runmgr-job's k8s.yaml)."""
    job_config = next(d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("runmgr-job"))
    return PurePosixPath(yaml.safe_load(job_config["data"]["k8s.yaml"])["run"]["dir"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_logbook_page_serves_the_run_s_folder_read_only_with_runmgr_s_own_command(build, overlay):
    docs = build(overlay, ("logbook-page",))
    job = the_rayjob(docs)
    head = head_group(job)["template"]
    (page,) = of_kind(docs, "Deployment")
    spec = page["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert page["metadata"]["namespace"] == job["metadata"]["namespace"]
    # runmgr's own parser reads the command as `runmgr logbook serve FOLDER --host 0.0.0.0 --port N`.
    assert container["command"][0] == "runmgr" and "args" not in container
    args = build_parser().parse_args(container["command"][1:])
    assert (args.command, args.action, args.host) == ("logbook", "serve", "0.0.0.0")
    (port,) = container["ports"]
    assert args.port == port["containerPort"]
    # The folder it serves holds the run's directory, on the shared volume it mounts read-only.
    served = PurePosixPath(args.run)
    assert served == run_dir(docs) or served in run_dir(docs).parents
    mount = max((m for m in container["volumeMounts"] if served == PurePosixPath(m["mountPath"])
                 or PurePosixPath(m["mountPath"]) in served.parents), key=lambda m: len(m["mountPath"]))
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    head_shared = next(v for v in head["spec"]["volumes"] if v["name"] == "shared")
    assert {k: v for k, v in volume.items() if k != "name"} == {k: v for k, v in head_shared.items() if k != "name"}
    if "persistentVolumeClaim" in volume:
        claims = {c["metadata"]["name"] for c in of_kind(docs, "PersistentVolumeClaim")}
        assert volume["persistentVolumeClaim"]["claimName"] in claims
    # The run's image; no accelerator; no API token.
    assert container["image"] == head["spec"]["containers"][0]["image"]
    assert not [r for r in resource_names(container) if r.startswith(ACCELERATORS)]
    assert spec["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # On the head's node (the logbook's writer): the affinity selects the head's pods, no worker's.
    (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert {g for g, labels in pods_of(job) if selects(term["labelSelector"], labels)} == {"head"}
    # The Service reaches the page's port.
    service = one(docs, "Service", "runmgr-logbook")
    assert selects({"matchLabels": service["spec"]["selector"]}, page["spec"]["template"]["metadata"]["labels"])
    assert selects(page["spec"]["selector"], page["spec"]["template"]["metadata"]["labels"])
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])


def test_the_logbook_page_s_command_fails_the_parser_when_it_is_wrong():
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["logbook", "serve", "/shared/runs", "--hots", "0.0.0.0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["logbook", "serve", "/shared/runs", "--port", "eighty"])


def test_each_run_s_logbook_page_follows_its_own_head(build):
    runs = {name: build("gpu", ("logbook-page",), name) for name in ("a", "b")}
    for name, docs in runs.items():
        (page,) = of_kind(docs, "Deployment")
        (term,) = page["spec"]["template"]["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        pods = [(run, g) for run, d in runs.items() for g, labels in pods_of(the_rayjob(d))
                if selects(term["labelSelector"], labels)]
        assert pods == [(name, "head")]
        claim = next(v for v in page["spec"]["template"]["spec"]["volumes"] if v["name"] == "shared")
        assert claim["persistentVolumeClaim"]["claimName"] == f"runmgr-shared-{name}"
