"""The cases of tests/test_readme.py for the README's "Running on Kubernetes"
command lines. No Docker engine and no Kubernetes API run on the test
machines, so:

- ``kubectl create ...`` runs as written plus ``--dry-run=client -o yaml``
  (kubectl builds the object offline) and the object is checked against what
  the manifests expect (namespace, Secret name and keys);
- ``kubectl apply -k DIR`` is ``kubectl kustomize DIR``: the objects apply
  would send, validated as tests/k8s does;
- ``docker``, ``kind``, ``kubectl logs/exec/port-forward`` need the real
  thing: their cases check that every name they use (image, namespace, Job,
  Service, port, run directory) is the one the manifests and the Dockerfile
  define, and that the runmgr command inside parses.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Callable

import yaml

from runmgr.cli import build_parser, parse_args
from tests.k8s.crd_schema import crd_errors
from tests.k8s.manifests import K8S, ROOT, kubectl, one, pod_templates, ray_cluster, rayjob, render, render_dir

GPU_IMAGE = "registry.example.com/runmgr:0.1.0"
LAPTOP_IMAGE = "runmgr:0.1.0"
NAMESPACE = "runmgr"


def images(overlay: str) -> set[str]:
    return {c["image"] for t in pod_templates(rayjob(render(overlay))).values() for c in t["spec"]["containers"]}


def dry_run(line: str) -> dict:
    result = subprocess.run([kubectl(), *shlex.split(line)[1:], "--dry-run=client", "-o", "yaml"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def dockerfile_args() -> set[str]:
    return {line.split()[1].split("=")[0] for line in (ROOT / "Dockerfile").read_text().splitlines()
            if line.startswith("ARG ")}


def case_build_cuda(ctx) -> None:
    assert "BASE" in dockerfile_args()
    assert "nvidia/cuda:12.8.1-runtime-ubuntu24.04" in (ROOT / "Dockerfile").read_text()  # the documented base
    assert images("gpu") == {GPU_IMAGE}


def case_push(ctx) -> None:
    assert images("gpu") == images("npu") == {GPU_IMAGE}


def case_build_cpu(ctx) -> None:
    default_base = next(line.split("=", 1)[1] for line in (ROOT / "Dockerfile").read_text().splitlines()
                        if line.startswith("ARG BASE="))
    assert default_base.startswith("python:")  # a CPU base; torch comes from pip
    assert images("cpu") == {LAPTOP_IMAGE}


def case_kind_load(ctx) -> None:
    assert images("cpu") == {LAPTOP_IMAGE}


def case_create_namespace(ctx) -> None:
    made = dry_run("kubectl create namespace runmgr")
    assert made["kind"] == "Namespace" and made["metadata"]["name"] == NAMESPACE
    assert rayjob(render("gpu"))["metadata"]["namespace"] == NAMESPACE


def case_create_secret(ctx) -> None:
    secret = dry_run("kubectl create secret generic runmgr-s3 -n runmgr "
                     "--from-literal=AWS_ACCESS_KEY_ID=KEY_ID --from-literal=AWS_SECRET_ACCESS_KEY=SECRET")
    assert (secret["kind"], secret["metadata"]["name"], secret["metadata"]["namespace"]) == \
        ("Secret", "runmgr-s3", NAMESPACE)
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}  # the names boto3 reads
    for template in pod_templates(rayjob(render("gpu"))).values():
        (container,) = template["spec"]["containers"]
        assert {"secretRef": {"name": "runmgr-s3", "optional": True}} in container["envFrom"]


def applied(overlay: str) -> None:
    docs = render_dir(K8S / "overlays" / overlay)
    job = rayjob(docs)
    assert crd_errors(job) == [] and crd_errors(ray_cluster(job)) == []
    assert {d["metadata"].get("namespace", NAMESPACE) for d in docs if d["kind"] != "Namespace"} == {NAMESPACE}


def case_apply_gpu(ctx) -> None:
    applied("gpu")


def case_apply_cpu(ctx) -> None:
    applied("cpu")


def case_logs(ctx) -> None:
    """KubeRay's submitter Job bears the RayJob's name and follows the Ray job's output."""
    job = rayjob(render("gpu"))
    assert (job["metadata"]["name"], job["metadata"]["namespace"]) == ("runmgr", NAMESPACE)
    assert job["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode"


def case_exec_logbook(ctx) -> None:
    docs = render("gpu")
    service = one(docs, "Service", "runmgr-metrics")
    head = pod_templates(rayjob(docs))["head"]
    assert service["spec"]["selector"].items() <= head["metadata"]["labels"].items()  # exec lands on the head
    run = yaml.safe_load((K8S / "overlays" / "gpu" / "run.yaml").read_text())["run"]
    argv = ["logbook", "show", run["dir"]]
    parse_args(build_parser(), argv)
    # A run directory named by its path, as in the pod (.health beside it is the exclusion history).
    local = next(p for p in sorted((ctx.cwd / "runs").iterdir()) if not p.name.startswith("."))
    assert ctx.ok("logbook", "show", str(local)).stdout.startswith(local.name)


def case_port_forward(ctx) -> None:
    (port,) = one(render("gpu"), "Service", "runmgr-metrics")["spec"]["ports"]
    assert port["port"] == 8000


CASES: dict[str, Callable] = {
    "docker build --build-arg BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 -t registry.example.com/runmgr:0.1.0 .":
        case_build_cuda,
    "docker push registry.example.com/runmgr:0.1.0": case_push,
    "kubectl create namespace runmgr": case_create_namespace,
    "kubectl create secret generic runmgr-s3 -n runmgr --from-literal=AWS_ACCESS_KEY_ID=KEY_ID "
    "--from-literal=AWS_SECRET_ACCESS_KEY=SECRET": case_create_secret,
    "kubectl apply -k k8s/overlays/gpu": case_apply_gpu,
    "kubectl logs -n runmgr -f job/runmgr": case_logs,
    "kubectl exec -n runmgr svc/runmgr-metrics -- runmgr logbook show /shared/runs/llama-1b3": case_exec_logbook,
    "kubectl port-forward -n runmgr svc/runmgr-metrics 8000": case_port_forward,
    "docker build -t runmgr:0.1.0 .": case_build_cpu,
    "kind load docker-image runmgr:0.1.0": case_kind_load,
    "kubectl apply -k k8s/overlays/cpu": case_apply_cpu,
}
"""README line -> what checks it (see the module's docstring)."""
