"""runmgr/kuberay.py against a fake API that reconciles as KubeRay does: only a
worker pod of the driver's own RayCluster is ever named in workersToDelete; a
pod already gone, a node Ray knows no pod of, and a refused call are records
that say why, never exceptions."""

from __future__ import annotations

from runmgr.kuberay import KubeRayReplacement, apis
from tests.runmgr.fake_kuberay import FakeKubeRay


def replacement(api: FakeKubeRay, pods: dict[str, str | None], cluster: str | None = None) -> KubeRayReplacement:
    core, custom = apis(api.url)
    return KubeRayReplacement(core, custom, api.namespace, cluster or api.cluster, pods.get, room=lambda avoid: 0,
                              check_id="run x")


def test_the_head_and_other_clusters_pods_are_never_named():
    with FakeKubeRay(["n1", "n2"], {"gpu": ["n1"]}) as api:
        (pod,) = api.pods
        api.pods[pod]["metadata"]["labels"]["ray.io/node-type"] = "head"
        (head,) = replacement(api, {"a": pod}).replace(["a"], "ECC")
        api.pods[pod]["metadata"]["labels"]["ray.io/node-type"] = "worker"
        (other,) = replacement(api, {"a": pod}, cluster="someone-else").replace(["a"], "ECC")
        assert not [r for r in api.requests if r["method"] == "PATCH"]  # not even the node's label
    assert not head.requested and "ray.io/node-type=head" in head.detail
    assert not other.requested and "not a worker of RayCluster someone-else" in other.detail


def test_a_pod_already_gone_or_unknown_is_said_not_raised():
    with FakeKubeRay(["n1"], {"gpu": ["n1"]}) as api:
        gone, unknown = replacement(api, {"a": "run12-gpu-worker-99", "b": None}).replace(["a", "b"], "ECC")
    assert not gone.requested and "already gone: KubeRay starts a new one itself" in gone.detail
    assert not unknown.requested and "knows no pod" in unknown.detail


def test_an_unanswered_api_is_said_not_raised():
    core, custom = apis("http://127.0.0.1:9")  # nothing listens there
    (request,) = KubeRayReplacement(core, custom, "train", "run12", {"a": "p"}.get, room=lambda avoid: 0,
                                    check_id="run x").replace(["a"], "ECC")
    assert not request.requested and "did not answer" in request.detail


def test_the_wait_ends_when_the_room_is_there_or_at_its_timeout():
    held = iter([0, 1, 2])
    now = [0.0]
    core, custom = apis("http://127.0.0.1:9")
    waiting = KubeRayReplacement(core, custom, "train", "run12", {}.get, room=lambda avoid: next(held),
                                 check_id="x", clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                                 poll_s=5.0)
    assert waiting.await_ranks(2, 60.0, ()).to_dict() == {"ranks": 2, "held": 2, "waited_s": 10.0, "timed_out": False}
    never = KubeRayReplacement(core, custom, "train", "run12", {}.get, room=lambda avoid: 1, check_id="x",
                               clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), poll_s=5.0)
    result = never.await_ranks(2, 12.0, ())
    assert result.timed_out and result.held == 1 and result.waited_s == 15.0
