"""Validate custom resources offline against the openAPIV3Schema of their
CustomResourceDefinition (tests/k8s/schemas/: kuberay/, and kueue/, volcano/,
prometheus-operator/ for the components' kinds), as an API server would
prune and reject them, only stricter: a field the schema does not declare is
an error (an API server would drop it silently, and the setting with it).

The translation to JSON Schema (draft 4, the base of OpenAPI 3.0):
- an object with ``properties`` and no ``x-kubernetes-preserve-unknown-fields``
  takes ``additionalProperties: false``;
- ``x-kubernetes-int-or-string`` becomes an integer-or-string;
- ``nullable`` adds null to the type;
- a pattern's global flag that RE2 allows mid-pattern moves to its start, where Python's ``re`` wants it.
CEL rules (``x-kubernetes-validations``) are not evaluated: the API server
does that and no evaluator is at hand.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jsonschema
import yaml

SCHEMAS = Path(__file__).resolve().parent / "schemas"
CRD_FILES = {("ray.io", "RayCluster"): SCHEMAS / "kuberay" / "ray.io_rayclusters.yaml",
             ("ray.io", "RayJob"): SCHEMAS / "kuberay" / "ray.io_rayjobs.yaml",
             # The optional components' kinds (k8s/components/*; each folder's README names its source).
             ("kueue.x-k8s.io", "LocalQueue"): SCHEMAS / "kueue" / "kueue.x-k8s.io_localqueues.yaml",
             ("scheduling.volcano.sh", "Queue"): SCHEMAS / "volcano" / "scheduling.volcano.sh_queues.yaml",
             ("monitoring.coreos.com", "ServiceMonitor"):
                 SCHEMAS / "prometheus-operator" / "monitoring.coreos.com_servicemonitors.yaml",
             ("monitoring.coreos.com", "PrometheusRule"):
                 SCHEMAS / "prometheus-operator" / "monitoring.coreos.com_prometheusrules.yaml"}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 1-2 MB of YAML
_NESTED_ONE = ("items", "not")
_NESTED_MANY = ("anyOf", "allOf", "oneOf")


def python_pattern(pattern: str) -> str:
    """A Go (RE2) pattern as Python's ``re`` takes it: RE2 allows a global flag such as ``(?i)``
    after ``^`` (prometheus-operator's ``^(?i)(abort|warn)?$``); Python only at the start."""
    for flag in ("(?i)",):
        if flag in pattern and not pattern.startswith(flag):
            pattern = flag + pattern.replace(flag, "")
    return pattern


def to_jsonschema(node: dict) -> dict:
    """One openAPIV3Schema node (and what it holds) as strict JSON Schema."""
    out: dict = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "description"):
            continue
        if key == "properties":
            out[key] = {name: to_jsonschema(child) for name, child in value.items()}
        elif key in _NESTED_ONE or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = to_jsonschema(value)
        elif key in _NESTED_MANY:
            out[key] = [to_jsonschema(child) for child in value]
        elif key == "pattern":
            out[key] = python_pattern(value)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") \
            and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_validator(group: str, kind: str, version: str) -> jsonschema.Draft4Validator:
    path = CRD_FILES.get((group, kind))
    if path is None:
        raise KeyError(f"no CRD for {kind}.{group} under {SCHEMAS}")
    crd = yaml.load(path.read_text(), Loader=_LOADER)
    assert crd["spec"]["names"]["kind"] == kind and crd["spec"]["group"] == group, path
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    if version not in served:
        raise KeyError(f"{kind}.{group} serves {sorted(served)}, not {version}")
    schema = to_jsonschema(served[version]["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def crd_errors(doc: dict) -> list[str]:
    """What is wrong with a custom resource, one line each (empty: valid)."""
    group, _, version = doc["apiVersion"].rpartition("/")
    validator = crd_validator(group, doc["kind"], version)
    return sorted(f"{doc['kind']} {doc['metadata']['name']}: "
                  f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
                  for error in validator.iter_errors(doc))
