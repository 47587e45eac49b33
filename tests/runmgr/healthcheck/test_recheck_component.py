"""k8s/components/recheck-excluded on top of an overlay, rendered as ``kubectl
apply -k`` would send it: its objects pass kubernetes-validate strict; its
DaemonSet goes to excluded nodes only (and through runmgr's taint), is a worker
pod where the figures depend on it (image, devices, mounts), knows its node,
gets the run's config; its container runs a command runmgr's own parser
accepts, with a config runmgr loads; its account may get and patch nodes and
nothing else."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runmgr.cli import build_parser, parse_args
from runmgr.config.compose import load_run_config
from runmgr.healthcheck.command import check_modes, cmd_health_check
from runmgr.healthcheck.k8s import HEALTH_LABEL, TAINT_KEY, TAINT_EFFECT
from tests.k8s.manifests import K8S, ROOT, of_kind, one, render_dir, rayjob, worker_groups
from tests.k8s.test_validate import builtin_errors

COMPONENT = K8S / "components" / "recheck-excluded"
DAEMONSET = "runmgr-recheck-excluded"


def render_with_component(tmp_path: Path, overlay: str) -> tuple[dict, ...]:
    """A kustomization of ours: ``overlay`` plus the component (relative paths: kustomize
    refuses absolute ones)."""
    here = tmp_path / "kustomization"
    here.mkdir()
    (here / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / overlay, here)],
        "components": [os.path.relpath(COMPONENT, here)]}))
    return render_dir(here)


def ours(docs) -> list[dict]:
    return [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            == "recheck-excluded"]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return render_with_component(tmp_path_factory.mktemp("gpu"), "gpu")


def test_the_component_s_objects_pass_kubernetes_validate_strict(gpu):
    docs = ours(gpu)
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    assert [line for doc in docs for line in builtin_errors(doc)] == []


def test_the_pods_go_to_excluded_nodes_only_through_our_taint(gpu):
    spec = one(gpu, "DaemonSet", DAEMONSET)["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": HEALTH_LABEL, "operator": "In", "values": ["excluded"]}]}]
    tolerated = {(t["key"], t.get("effect")) for t in spec["tolerations"] if t["operator"] == "Exists"}
    assert (TAINT_KEY, TAINT_EFFECT) in tolerated
    worker = worker_groups(rayjob(gpu))[0]["template"]["spec"]
    # Wherever a worker could go (the GPU pool's taint), the re-check can follow.
    assert {(t["key"], t.get("effect")) for t in worker.get("tolerations", [])} <= tolerated


@pytest.mark.parametrize("overlay", ["gpu", "npu"])
def test_the_pod_is_a_worker_where_the_figures_depend_on_it(overlay, gpu, tmp_path):
    docs = gpu if overlay == "gpu" else render_with_component(tmp_path, overlay)
    pod = one(docs, "DaemonSet", DAEMONSET)["spec"]["template"]["spec"]
    worker = worker_groups(rayjob(docs))[0]["template"]["spec"]
    (container,), (worker_container,) = pod["containers"], worker["containers"]
    assert container["image"] == worker_container["image"] != "runmgr"
    assert container["resources"] == worker_container["resources"]  # the node's GPUs or NPUs, its CPUs
    assert any(k.endswith(("/gpu", "Ascend910")) for k in container["resources"]["limits"])
    assert container["volumeMounts"] == worker_container["volumeMounts"]
    assert pod["volumes"] == worker["volumes"]  # the shared file system, /dev/shm, vendor drivers
    env = {e["name"]: e for e in container["env"]}
    assert env["RUNMGR_K8S_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    ref = env["RUNMGR_RUN_CONFIG"]["valueFrom"]["configMapKeyRef"]
    assert ref["key"] in one(docs, "ConfigMap", ref["name"])["data"]
    namespace = rayjob(docs)["metadata"]["namespace"]
    assert one(docs, "DaemonSet", DAEMONSET)["metadata"]["namespace"] == namespace


def runmgr_commands(script: str) -> list[list[str]]:
    return [shlex.split(line) for line in script.splitlines() if line.strip().startswith("runmgr ")]


def test_the_container_runs_a_command_runmgr_accepts_with_a_config_runmgr_loads(gpu, tmp_path):
    container = one(gpu, "DaemonSet", DAEMONSET)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    assert subprocess.run(["sh", "-n", "-c", script], capture_output=True).returncode == 0
    (command,) = runmgr_commands(script)
    args = parse_args(build_parser(), command[1:])
    check_modes(args)  # refuses flags that do not go together
    assert args.func is cmd_health_check and args.recheck_self and args.k8s_label and not args.k8s_taint
    conf = [item.split("=", 1)[1] for item in args.items if item.startswith("conf=")]
    assert conf == ["k8s"]
    # The script puts the ConfigMap's run config beside the image's configs as conf=k8s.
    env = {e["name"]: e for e in container["env"]}
    ref = env["RUNMGR_RUN_CONFIG"]["valueFrom"]["configMapKeyRef"]
    conf_dir = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf_dir)
    (conf_dir / "k8s.yaml").write_text(one(gpu, "ConfigMap", ref["name"])["data"][ref["key"]])
    config = load_run_config("k8s", [item for item in args.items if not item.startswith("conf=")], conf_dir)
    assert config.health is not None
    assert "/opt/runmgr/conf/." in script and "$RUNMGR_CONF_DIR/k8s.yaml" in script


def test_the_account_may_get_and_patch_nodes_and_nothing_else(gpu):
    pod = one(gpu, "DaemonSet", DAEMONSET)
    account = pod["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = pod["metadata"]["namespace"]
    assert one(gpu, "ServiceAccount", account)["metadata"]["namespace"] == namespace
    bindings = [b for b in of_kind(ours(gpu), "ClusterRoleBinding")
                if {"kind": "ServiceAccount", "name": account, "namespace": namespace} in b["subjects"]]
    assert len(bindings) == 1 and bindings[0]["roleRef"]["kind"] == "ClusterRole"
    role = one(gpu, "ClusterRole", bindings[0]["roleRef"]["name"])
    # --recheck-self reads its node and patches runmgr's marks: read_node, patch_node.
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert not [r for r in of_kind(ours(gpu), "Role")]
