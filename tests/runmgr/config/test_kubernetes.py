"""kubernetes.replace_excluded_nodes is honoured or refused in one line: it needs the
run inside a KubeRay cluster, and the RayCluster's namespace and name."""

from __future__ import annotations

from runmgr.config.kubernetes import NAMESPACE_ENV, RAY_CLUSTER_ENV, KubernetesConfig


def test_off_asks_nothing_of_the_environment(monkeypatch):
    monkeypatch.delenv(NAMESPACE_ENV, raising=False)
    assert KubernetesConfig().launch_problems(None) == []


def test_on_a_local_ray_it_is_refused():
    (problem,) = KubernetesConfig(replace_excluded_nodes=True).launch_problems(None)
    assert "a local Ray has no pods to replace" in problem and "\n" not in problem


def test_inside_the_cluster_it_reads_the_pod_s_variables_or_says_which_are_missing(monkeypatch):
    monkeypatch.delenv(NAMESPACE_ENV, raising=False)
    monkeypatch.delenv(RAY_CLUSTER_ENV, raising=False)
    config = KubernetesConfig(replace_excluded_nodes=True)
    (problem,) = config.launch_problems("auto")
    assert NAMESPACE_ENV in problem and RAY_CLUSTER_ENV in problem
    monkeypatch.setenv(NAMESPACE_ENV, "train")
    monkeypatch.setenv(RAY_CLUSTER_ENV, "runmgr-llama70b-x7k2p")
    assert config.launch_problems("auto") == []
    assert (config.resolved_namespace(), config.resolved_ray_cluster()) == ("train", "runmgr-llama70b-x7k2p")
    explicit = KubernetesConfig(replace_excluded_nodes=True, namespace="other", ray_cluster="rc")
    assert (explicit.resolved_namespace(), explicit.resolved_ray_cluster()) == ("other", "rc")
