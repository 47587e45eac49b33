"""The kustomize overlays of k8s/ rendered as ``kubectl apply -k`` would send
them (``kubectl kustomize``, offline), and the parts the tests look at."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, Optional

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = tuple(sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml")))
"""Every overlay a user can apply (k8s/overlays/NAME)."""
KUBERNETES_VERSION = "1.32"
"""The Kubernetes release the built-in kinds are validated against (kubectl 1.32's)."""
RAYJOB_NAME = "runmgr"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is needed to render k8s/ (`kubectl kustomize`): install kubectl 1.27 or newer")
    return path


def render_dir(directory: Path) -> tuple[dict, ...]:
    """The documents ``kubectl kustomize DIRECTORY`` prints."""
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr.strip()}"
    # libyaml's safe loader, where PyYAML has it: the same documents, parsed about ten times faster
    # (the pure-Python parser was most of tests/k8s/test_components.py's time).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(doc for doc in yaml.load_all(result.stdout, Loader=loader) if doc)


@functools.lru_cache(maxsize=None)
def render(overlay: str) -> tuple[dict, ...]:
    """k8s/overlays/OVERLAY rendered (once per session; callers must not mutate it)."""
    return render_dir(K8S / "overlays" / overlay)


RUN_KUSTOMIZATION = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../overlays/{overlay}
nameSuffix: -{name}
labels:
  - pairs:
      runmgr.io/run: {name}
    includeSelectors: true
"""
"""A run of its own, as docs/kubernetes.md and the README write it: k8s/runs/NAME/kustomization.yaml."""


def run_tree(root: Path) -> Path:
    """``root/k8s``: the repository's k8s/ folders (linked, not copied) beside an empty
    ``runs/``, so that a run's kustomization sits where a user puts it and names the
    overlays by the same relative paths, without writing into the repository."""
    tree = root / "k8s"
    (tree / "runs").mkdir(parents=True, exist_ok=True)
    for part in K8S.iterdir():
        if part.is_dir() and part.name != "runs" and not (tree / part.name).exists():
            (tree / part.name).symlink_to(part, target_is_directory=True)
    return tree


def render_run(root: Path, name: str, overlay: str, text: Optional[str] = None,
               files: Optional[dict[str, str]] = None) -> tuple[dict, ...]:
    """The run NAME (k8s/runs/NAME, a kustomization of ``overlay`` with its name
    suffix and label, or ``text``, with ``files`` beside it) rendered under ``root``."""
    directory = run_tree(root) / "runs" / name
    directory.mkdir(parents=True, exist_ok=True)
    for file_name, content in (files or {}).items():
        (directory / file_name).write_text(content)
    (directory / "kustomization.yaml").write_text(text or RUN_KUSTOMIZATION.format(name=name, overlay=overlay))
    return render_dir(directory)


def of_kind(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind: str, name: Optional[str] = None) -> dict:
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rayjob(docs, name: str = RAYJOB_NAME) -> dict:
    return one(docs, "RayJob", name)


def ray_cluster(job: dict) -> dict:
    """The RayCluster KubeRay creates for the RayJob (its rayClusterSpec)."""
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": job["metadata"]["name"], "namespace": job["metadata"].get("namespace")},
            "spec": job["spec"]["rayClusterSpec"]}


def head_group(job: dict) -> dict:
    return job["spec"]["rayClusterSpec"]["headGroupSpec"]


def worker_groups(job: dict) -> list[dict]:
    return job["spec"]["rayClusterSpec"].get("workerGroupSpecs", [])


def holds_ranks(group: dict) -> bool:
    """Ray may place ranks on the group's pods (a driver-only head says num-cpus 0)."""
    return group.get("rayStartParams", {}).get("num-cpus") != "0"


def vendor_resources(container: dict) -> dict[str, str]:
    """The device plugins' resources a container's limits ask for (``nvidia.com/gpu: "8"``)."""
    return {k: v for k, v in container.get("resources", {}).get("limits", {}).items() if "/" in k}


def rank_groups(job: dict) -> dict[str, dict]:
    """The groups whose pods hold ranks, by name (``head`` for the head group),
    each with its ``replicas`` (the head: 1)."""
    groups = {"head": {**head_group(job), "replicas": 1}}
    groups.update({g["groupName"]: g for g in worker_groups(job)})
    return {name: g for name, g in groups.items() if holds_ranks(g)}


def pod_templates(job: dict) -> dict[str, dict]:
    """Pod template per group: ``head`` and each worker group's name."""
    templates = {"head": head_group(job)["template"]}
    templates.update({g["groupName"]: g["template"] for g in worker_groups(job)})
    return templates


def containers(template: dict) -> Iterator[dict]:
    spec = template["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def volume(template: dict, name: str) -> dict:
    found = [v for v in template["spec"].get("volumes", []) if v["name"] == name]
    assert len(found) == 1, f"expected one volume {name}, found {len(found)}"
    return found[0]


def mount_at(container: dict, path: str) -> Optional[dict]:
    return next((m for m in container.get("volumeMounts", []) if m["mountPath"] == path), None)


def env_value(container: dict, name: str) -> Optional[dict]:
    return next((e for e in container.get("env", []) if e["name"] == name), None)


def config_map_data(docs, name: str) -> dict[str, str]:
    return one(docs, "ConfigMap", name).get("data", {})
