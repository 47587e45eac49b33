"""The cases of tests/test_readme.py for the README's "Running on Kubernetes"
command lines. No Docker engine and no Kubernetes API run on the test
machines, so:

- ``kubectl create ...`` runs as written plus ``--dry-run=client -o yaml``
  (kubectl builds the object offline) and the object is checked against what
  the manifests expect (namespace, Secret name and keys); ``kubectl run``
  asks the API server even then, so its pod is built as kubectl builds it,
  the line's ``--overrides`` merged in, and checked against Kubernetes'
  schema and the run's claim;
- ``kubectl apply -k DIR [-l SELECTOR]`` is ``kubectl kustomize DIR`` (and the
  selector applied to what it prints): the objects apply would send,
  validated as tests/k8s does. The README's run (k8s/runs/llama-70b) is made
  as the README says, from its own kustomization.yaml block and a copy of the
  overlay's run.yaml, in a temporary tree beside the repository's k8s/;
- ``docker``, ``kind``, ``mkdir``/``cp`` of the run, ``kubectl
  logs/exec/cp/port-forward/get/delete`` need the real thing: their cases
  check that every name and path they use (image, recipe, namespace, Job,
  Service, pod, port, label, data and run directories) is the one the
  manifests, the run's config and the Dockerfiles define, and that the
  runmgr command inside parses.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import Callable

import yaml

from runmgr.cli import build_parser, parse_args
from runmgr.config.argv import flag_value
from runmgr.healthcheck.k8s import HEALTH_LABEL
from tests.runmgr.healthcheck.fake_k8s import merge_patch
from tests.k8s.crd_schema import crd_errors
from tests.k8s.manifests import (K8S, ROOT, kubectl, one, pod_templates, ray_cluster, rayjob, render, render_dir,
                                 render_run)

LAPTOP_IMAGE = "runmgr:0.1.0"
MEGATRON_IMAGE = "registry.example.com/runmgr-megatron:0.1.0"
NAMESPACE = "runmgr"
RUN = "llama-70b"
"""The README's run: k8s/runs/llama-70b, a kustomization of the megatron-gpu overlay."""
RUN_OVERLAY = "megatron-gpu"
COPY_POD = "copy-llama-70b"
COPY_POD_LINE = ("kubectl run copy-llama-70b -n runmgr --image=busybox:1.36 --restart=Never --overrides='"
                 '{"spec":{"containers":[{"name":"copy-llama-70b","image":"busybox:1.36","command":["sleep","86400"],'
                 '"volumeMounts":[{"name":"shared","mountPath":"/shared"}]}],"volumes":[{"name":"shared",'
                 '"persistentVolumeClaim":{"claimName":"runmgr-shared-llama-70b"}}]}}' + "'")
"""The README's pod that mounts the run's claim to copy the data onto it."""
README = ROOT / "README.md"
_KEEP: list = []  # the temporary trees of the rendered run, removed at exit


def images(overlay: str) -> set[str]:
    return {c["image"] for t in pod_templates(rayjob(render(overlay))).values() for c in t["spec"]["containers"]}


def dry_run(line: str) -> dict:
    result = subprocess.run([kubectl(), *shlex.split(line)[1:], "--dry-run=client", "-o", "yaml"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def dockerfile_args(path=ROOT / "Dockerfile") -> dict[str, str]:
    return dict(line.split()[1].split("=", 1) for line in path.read_text().splitlines()
                if line.startswith("ARG ") and "=" in line)


def readme_kustomization() -> str:
    """The README's k8s/runs/llama-70b/kustomization.yaml, as its YAML block shows it."""
    text = README.read_text(encoding="utf-8")
    after = text[text.index(f"`k8s/runs/{RUN}/kustomization.yaml`"):]
    block = re.search(r"```yaml\n(.*?)```", after, re.S).group(1)
    return textwrap.dedent(block)


@functools.lru_cache(maxsize=None)
def run_docs() -> tuple[dict, ...]:
    """The README's run rendered: its kustomization.yaml and the overlay's run.yaml copied beside it."""
    root = tempfile.TemporaryDirectory()
    _KEEP.append(root)
    run_yaml = (K8S / "overlays" / RUN_OVERLAY / "run.yaml").read_text()
    return render_run(Path(root.name), RUN, RUN_OVERLAY, readme_kustomization(), {"run.yaml": run_yaml})


def run_job() -> dict:
    return rayjob(run_docs(), f"runmgr-{RUN}")


def run_config() -> dict:
    return yaml.safe_load(one(run_docs(), "ConfigMap", f"runmgr-job-{RUN}")["data"]["k8s.yaml"])


def run_images() -> set[str]:
    return {c["image"] for t in pod_templates(run_job()).values() for c in t["spec"]["containers"]}


def run_claim() -> str:
    (claim,) = {t["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] for t in pod_templates(run_job()).values()}
    return claim


def selected(docs, selector: str) -> list[dict]:
    """The documents ``kubectl apply -l KEY=VALUE`` keeps."""
    key, value = selector.split("=", 1)
    return [d for d in docs if d["metadata"].get("labels", {}).get(key) == value]


def applied(docs) -> None:
    from tests.k8s.test_validate import builtin_errors, is_ray

    job = one(docs, "RayJob")
    assert crd_errors(job) == [] and crd_errors(ray_cluster(job)) == []
    assert [line for doc in docs if not is_ray(doc) for line in builtin_errors(doc)] == []
    assert {d["metadata"].get("namespace", NAMESPACE) for d in docs} == {NAMESPACE}


# ---- the user's Megatron job: the image -----------------------------------------------------------


def case_build_megatron(ctx) -> None:
    recipe = K8S / "image" / "Dockerfile"
    args = dockerfile_args(recipe)
    assert args["BASE"] == "nvcr.io/nvidia/pytorch:25.01-py3"  # the base the README builds on
    assert "RAY_VERSION" in args and "MEGATRON_REF" in args
    assert run_images() == images(RUN_OVERLAY) == {MEGATRON_IMAGE}


def case_push_megatron(ctx) -> None:
    assert run_images() == {MEGATRON_IMAGE}


# ---- the run of its own ---------------------------------------------------------------------------


def case_mkdir_run(ctx) -> None:
    kustomization = yaml.safe_load(readme_kustomization())
    assert kustomization["nameSuffix"] == f"-{RUN}"
    assert kustomization["labels"] == [{"pairs": {"runmgr.io/run": RUN}, "includeSelectors": True}]
    assert kustomization["resources"] == [f"../../overlays/{RUN_OVERLAY}"]


def case_copy_run_yaml(ctx) -> None:
    """The run's ConfigMap holds the copy (what the user edits), not the overlay's by accident."""
    assert run_config() == yaml.safe_load((K8S / "overlays" / RUN_OVERLAY / "run.yaml").read_text())
    (generator,) = yaml.safe_load(readme_kustomization())["configMapGenerator"]
    assert generator == {"name": "runmgr-job", "behavior": "merge", "files": ["k8s.yaml=run.yaml"]}


def case_create_namespace(ctx) -> None:
    made = dry_run("kubectl create namespace runmgr")
    assert made["kind"] == "Namespace" and made["metadata"]["name"] == NAMESPACE
    assert run_job()["metadata"]["namespace"] == NAMESPACE
    assert not [d for d in run_docs() if d["kind"] == "Namespace"]  # the user's, shared by runs


def case_create_secret(ctx) -> None:
    secret = dry_run("kubectl create secret generic runmgr-s3 -n runmgr "
                     "--from-literal=AWS_ACCESS_KEY_ID=KEY_ID --from-literal=AWS_SECRET_ACCESS_KEY=SECRET")
    assert (secret["kind"], secret["metadata"]["name"], secret["metadata"]["namespace"]) == \
        ("Secret", "runmgr-s3", NAMESPACE)
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}  # the names boto3 reads
    for template in pod_templates(run_job()).values():
        (container,) = template["spec"]["containers"]
        assert {"secretRef": {"name": "runmgr-s3", "optional": True}} in container["envFrom"]


# ---- the data on the shared volume ----------------------------------------------------------------


def case_apply_storage(ctx) -> None:
    (claim,) = selected(run_docs(), "app.kubernetes.io/component=shared-storage")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == run_claim()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def copy_pod() -> dict:
    """The pod ``kubectl run NAME -n NS --image=I --restart=Never --overrides=JSON`` creates:
    kubectl's generated pod with the overrides merged in. (kubectl run asks the API server
    even with --dry-run=client, so its generated object is written here as kubectl writes it.)"""
    words = shlex.split(COPY_POD_LINE)
    assert words[:3] == ["kubectl", "run", COPY_POD]
    options = dict(w.split("=", 1) for w in words[3:] if w.startswith("--") and "=" in w)
    namespace = words[words.index("-n") + 1]
    assert set(options) == {"--image", "--restart", "--overrides"}
    generated = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": COPY_POD, "namespace": namespace, "labels": {"run": COPY_POD}},
                 "spec": {"containers": [{"name": COPY_POD, "image": options["--image"]}],
                          "restartPolicy": options["--restart"], "dnsPolicy": "ClusterFirst"}}
    return merge_patch(generated, json.loads(options["--overrides"]))


def case_copy_pod(ctx) -> None:
    from tests.k8s.test_validate import builtin_errors

    pod = copy_pod()
    assert (pod["kind"], pod["metadata"]["name"], pod["metadata"]["namespace"]) == ("Pod", COPY_POD, NAMESPACE)
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == run_claim()
    (container,) = pod["spec"]["containers"]
    assert container["name"] == COPY_POD and container["command"] == ["sleep", "86400"]  # there to copy into
    assert container["volumeMounts"] == [{"name": volume["name"], "mountPath": "/shared"}]
    assert builtin_errors(pod) == []


def job_paths() -> dict[str, str]:
    args = run_config()["megatron"]["args"]
    return {flag: flag_value(args, flag) for flag in ("--tokenizer-model", "--data-path", "--save")}


def case_copy_mkdir(ctx) -> None:
    paths = job_paths()
    assert paths["--tokenizer-model"].startswith("/shared/tokenizers/llama2/")
    assert paths["--data-path"].startswith("/shared/data/")


def case_copy_tokenizer(ctx) -> None:
    assert job_paths()["--tokenizer-model"] == "/shared/tokenizers/llama2/tokenizer.model"


def case_copy_data(ctx) -> None:
    assert job_paths()["--data-path"] == "/shared/data/corpus_text_document"  # Megatron reads PREFIX.bin and PREFIX.idx


def case_delete_copy_pod(ctx) -> None:
    assert (copy_pod()["metadata"]["name"], copy_pod()["metadata"]["namespace"]) == (COPY_POD, NAMESPACE)


# ---- start and watch ------------------------------------------------------------------------------


def case_apply_run(ctx) -> None:
    applied(run_docs())
    assert run_job()["metadata"]["name"] == f"runmgr-{RUN}"


def case_logs_run(ctx) -> None:
    """KubeRay's submitter Job bears the RayJob's name and follows the Ray job's output."""
    job = run_job()
    assert (job["metadata"]["name"], job["metadata"]["namespace"]) == (f"runmgr-{RUN}", NAMESPACE)
    assert job["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode"


def metrics_service() -> dict:
    return one(run_docs(), "Service", f"runmgr-metrics-{RUN}")


def case_exec_logbook_run(ctx) -> None:
    head = pod_templates(run_job())["head"]
    assert metrics_service()["spec"]["selector"].items() <= head["metadata"]["labels"].items()  # exec lands on the head
    assert run_config()["run"]["dir"] == f"/shared/runs/{RUN}"
    parse_args(build_parser(), ["logbook", "show", f"/shared/runs/{RUN}"])
    # A run directory named by its path, as in the pod (.health beside it is the exclusion history).
    local = ctx.cwd / "runs" / "readme"  # tests/test_readme.py's small run (its shadow runs are beside it)
    assert ctx.ok("logbook", "show", str(local)).stdout.startswith(local.name)


def case_port_forward_run(ctx) -> None:
    (port,) = metrics_service()["spec"]["ports"]
    assert port["port"] == 8000


def case_get_nodes(ctx) -> None:
    assert HEALTH_LABEL == "runmgr.io/health"
    terms = run_job()["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["affinity"]
    assert HEALTH_LABEL in str(terms)  # the label the pods keep off


def case_readmit(ctx) -> None:
    from runmgr.healthcheck.command import check_modes

    args = parse_args(build_parser(), ["health-check", "conf=k8s", "--readmit", "gpu-node-17"])
    check_modes(args)
    assert args.readmit == ["gpu-node-17"] and "conf=k8s" in args.items
    rules = [r for d in run_docs() if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]} in rules


# ---- the laptop -----------------------------------------------------------------------------------


def case_build_cpu(ctx) -> None:
    assert dockerfile_args()["BASE"].startswith("python:")  # a CPU base; torch comes from pip
    assert images("cpu") == {LAPTOP_IMAGE}


def case_kind_load(ctx) -> None:
    assert images("cpu") == {LAPTOP_IMAGE}


def case_apply_cpu(ctx) -> None:
    applied(render_dir(K8S / "overlays" / "cpu"))


CASES: dict[str, Callable] = {
    "docker build -f k8s/image/Dockerfile --build-arg BASE=nvcr.io/nvidia/pytorch:25.01-py3 "
    "-t registry.example.com/runmgr-megatron:0.1.0 .": case_build_megatron,
    "docker push registry.example.com/runmgr-megatron:0.1.0": case_push_megatron,
    "mkdir -p k8s/runs/llama-70b": case_mkdir_run,
    "cp k8s/overlays/megatron-gpu/run.yaml k8s/runs/llama-70b/run.yaml": case_copy_run_yaml,
    "kubectl create namespace runmgr": case_create_namespace,
    "kubectl create secret generic runmgr-s3 -n runmgr --from-literal=AWS_ACCESS_KEY_ID=KEY_ID "
    "--from-literal=AWS_SECRET_ACCESS_KEY=SECRET": case_create_secret,
    "kubectl apply -k k8s/runs/llama-70b -l app.kubernetes.io/component=shared-storage": case_apply_storage,
    COPY_POD_LINE: case_copy_pod,
    "kubectl exec -n runmgr copy-llama-70b -- mkdir -p /shared/tokenizers/llama2 /shared/data": case_copy_mkdir,
    "kubectl cp tokenizer.model runmgr/copy-llama-70b:/shared/tokenizers/llama2/tokenizer.model":
        case_copy_tokenizer,
    "kubectl cp corpus_text_document.bin runmgr/copy-llama-70b:/shared/data/corpus_text_document.bin":
        case_copy_data,
    "kubectl cp corpus_text_document.idx runmgr/copy-llama-70b:/shared/data/corpus_text_document.idx":
        case_copy_data,
    "kubectl delete pod -n runmgr copy-llama-70b": case_delete_copy_pod,
    "kubectl apply -k k8s/runs/llama-70b": case_apply_run,
    "kubectl logs -n runmgr -f job/runmgr-llama-70b": case_logs_run,
    "kubectl exec -n runmgr svc/runmgr-metrics-llama-70b -- runmgr logbook show /shared/runs/llama-70b":
        case_exec_logbook_run,
    "kubectl port-forward -n runmgr svc/runmgr-metrics-llama-70b 8000": case_port_forward_run,
    "kubectl get nodes -L runmgr.io/health": case_get_nodes,
    "kubectl exec -n runmgr svc/runmgr-metrics-llama-70b -- runmgr health-check conf=k8s --readmit gpu-node-17":
        case_readmit,
    "docker build -t runmgr:0.1.0 .": case_build_cpu,
    "kind load docker-image runmgr:0.1.0": case_kind_load,
    "kubectl apply -k k8s/overlays/cpu": case_apply_cpu,
}
"""README line -> what checks it (see the module's docstring)."""
