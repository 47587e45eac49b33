"""An excluded node's worker pod replaced through KubeRay, with the controller
stepped (a fake worker group whose ranks sit on the pods of a fake Kubernetes
API that reconciles the RayCluster as KubeRay does): the ECC error's node is
labelled, its pod named in ``workersToDelete``, KubeRay's replacement comes up
on another node, and the next sub-run runs at full size on it. The judge,
policy, controller and runmgr/kuberay.py are the real ones."""

from __future__ import annotations

import hashlib
from collections import deque

from runmgr.controller.group import GroupPoll, WorkerInfo
from runmgr.controller.judge import ClusterSlots, Judge
from runmgr.nodes import node_name
from runmgr.controller.machine import Controller, SubrunIds
from runmgr.controller.states import Finished, Launching, Restarting, Running
from runmgr.config.policy import PolicyConfig
from runmgr.config.watcher import WatcherConfig
from runmgr.errors import ClusterError
from runmgr.healthcheck.k8s import HEALTH_LABEL
from runmgr.kuberay import KubeRayReplacement, apis
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation
from tests.runmgr.controller.fakes import CHECKPOINTS, Recorder, step_report
from tests.runmgr.fake_kuberay import FakeKubeRay
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

TRAIN_ITERS = 40


def ray_id(pod: str) -> str:
    """The Ray node id of the Ray node a pod runs (hex, as Ray's are)."""
    return hashlib.sha1(pod.encode()).hexdigest()


class PodGroup:
    """A fake worker group whose ranks sit, one per pod, on the fake API's worker pods
    (oldest first) outside the plan's nodes to avoid."""

    def __init__(self, api: FakeKubeRay, polls: list[GroupPoll], fail_start: bool = False) -> None:
        self.api, self.polls, self.fail_start = api, deque(polls), fail_start
        self.started_with: ResumePlan | None = None
        self.pods: list[str] = []

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        self.started_with = plan
        if self.fail_start:
            raise ClusterError("placement group not ready within 180 s")
        usable = [p for p in self.api.pods if node_name(ray_id(p)) not in plan.avoid_nodes]
        self.pods = usable[:plan.data_parallel_size]
        return [WorkerInfo(rank, 100 + rank, ray_id(pod), "10.0.0.1") for rank, pod in enumerate(self.pods)]

    def poll(self, timeout_s: float) -> GroupPoll:
        return self.polls.popleft() if self.polls else GroupPoll()

    def shutdown(self) -> None:
        pass


def stepped(api: FakeKubeRay, groups: list[PodGroup], bad_pod: str) -> tuple[Controller, Recorder, list]:
    """A controller over ``groups`` whose device poll reports an uncorrectable ECC error on
    ``bad_pod``'s node at its first reading."""
    def slots() -> dict[str, int]:  # what Ray's alive nodes hold: one rank per worker pod
        return {node_name(ray_id(pod)): 1 for pod in api.pods}

    def pod_of(node: str) -> str | None:
        return next((pod for pod in api.pods if node_name(ray_id(pod)) == node), None)

    readings = deque([[DeviceObservation(node_name(ray_id(bad_pod)), 0, "ecc", 2000.0, correctable=0,
                                         uncorrectable=2)]])
    slept: list[float] = []
    core, custom = apis(api.url)
    replacement = KubeRayReplacement(core, custom, api.namespace, api.cluster, pod_of,
                                     room=lambda avoid: sum(n for node, n in slots().items() if node not in avoid),
                                     check_id="run12 sub-run 12.00", clock=lambda: 2000.0 + len(slept),
                                     sleep=slept.append)
    config = TrainerConfig()
    config.training.train_iters = TRAIN_ITERS
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda max_step: [c for c in CHECKPOINTS if c.step <= max_step],
                  ClusterSlots(slots, (2, 1), replacement_wait_s=900.0))
    queue, recorder = deque(groups), Recorder()
    controller = Controller(
        Launching("12.00", ResumePlan(subrun="12.00", data_parallel_size=2), 0, "launch"), config,
        make_group=queue.popleft, resume_at=lambda step, why: ResumePoint("/ck/step_00000020", 20), judge=judge,
        subrun_ids=SubrunIds(12, 1), poll_interval_s=0.0, observers=[recorder], clock=lambda: 2000.0,
        sleep=recorder.slept.append, read_devices=lambda: readings.popleft() if readings else [],
        nodes=replacement)
    return controller, recorder, slept


def until_restarting(controller: Controller) -> Restarting:
    assert isinstance(controller.step(), Running)
    state = controller.step()
    assert isinstance(state, Restarting), state
    return state


def finishing(step: int, subrun: str) -> list[GroupPoll]:
    return [GroupPoll(steps=[step_report(step, subrun=subrun)]), GroupPoll(finished_ranks=[0, 1])]


def test_an_excluded_node_s_pod_is_replaced_through_workers_to_delete_and_the_next_subrun_runs_at_full_size():
    with FakeKubeRay(["gpu-1", "gpu-2", "gpu-3"], {"gpu": ["gpu-1", "gpu-2"]}) as api:  # no spare pod
        first_pods = list(api.pods)
        bad_pod = first_pods[1]
        first = PodGroup(api, [GroupPoll(steps=[step_report(25, subrun="12.00")])])
        second = PodGroup(api, finishing(TRAIN_ITERS, "12.01"))
        controller, recorder, _ = stepped(api, [first, second], bad_pod)

        decision = until_restarting(controller).judgement.decision
        assert decision.action == "exclude_node" and decision.replace_nodes == (node_name(ray_id(bad_pod)),)
        assert decision.data_parallel_size == 2 and decision.await_ranks == 2  # sized on the replacement
        assert "the cluster replaces the pod of" in decision.reason

        launching = controller.step()
        assert isinstance(launching, Launching) and launching.subrun == "12.01"
        patches = [r for r in api.requests if r["method"] == "PATCH" and "/rayclusters/" in r["path"]]
        assert len(patches) == 1 and patches[0]["content_type"] == "application/merge-patch+json"
        (group,) = patches[0]["body"]["spec"]["workerGroupSpecs"]
        assert group["scaleStrategy"]["workersToDelete"] == [bad_pod]
        assert api.deleted == [bad_pod]
        assert api.nodes["gpu-2"]["metadata"]["labels"][HEALTH_LABEL] == "excluded"
        (new_pod,) = set(api.pods) - set(first_pods)
        assert api.pods_on()[new_pod] == "gpu-3"  # KubeRay's replacement, off the labelled node
        (request,) = launching.evidence["replacements"]
        assert request["requested"] and request["pod"] == bad_pod and request["k8s_node"] == "gpu-2"
        assert launching.evidence["replacement_wait"] == {"ranks": 2, "held": 2, "waited_s": 0.0,
                                                          "timed_out": False}

        assert isinstance(controller.step(), Running)
        assert second.started_with.data_parallel_size == 2  # full size, not shrunk to 1
        assert second.pods == [first_pods[0], new_pod]
        while not isinstance(controller.state, Finished):
            controller.step()
    assert [j.decision.action for j in recorder.judgements] == ["exclude_node"]


def test_with_a_spare_pod_the_restart_runs_at_once_and_the_replacement_restores_the_spare():
    with FakeKubeRay(["gpu-1", "gpu-2", "gpu-3", "gpu-4"], {"gpu": ["gpu-1", "gpu-2", "gpu-3"]}) as api:
        first_pods = list(api.pods)
        first = PodGroup(api, [GroupPoll(steps=[step_report(25, subrun="12.00")])])
        second = PodGroup(api, finishing(TRAIN_ITERS, "12.01"))
        controller, _, slept = stepped(api, [first, second], first_pods[0])

        decision = until_restarting(controller).judgement.decision
        assert decision.replace_nodes and decision.await_ranks == 0 and decision.data_parallel_size == 2
        launching = controller.step()
        assert "replacement_wait" not in launching.evidence and slept == []
        assert api.deleted == [first_pods[0]] and api.pods_on()[api.created[-1]] == "gpu-4"
        controller.step()
        assert second.pods == first_pods[1:]  # the spare took the excluded node's rank
        assert len(api.pods) == 3  # and KubeRay brought the group back to three pods: a spare again


def test_a_refused_replacement_is_recorded_and_the_run_shrinks_when_the_launch_cannot_place():
    with FakeKubeRay(["gpu-1", "gpu-2", "gpu-3"], {"gpu": ["gpu-1", "gpu-2"]}, refuse_raycluster=403) as api:
        first_pods = list(api.pods)
        first = PodGroup(api, [GroupPoll(steps=[step_report(25, subrun="12.00")])])
        waiting = PodGroup(api, [], fail_start=True)  # no room for two: the replacement never came
        third = PodGroup(api, finishing(TRAIN_ITERS, "12.02"))
        controller, recorder, slept = stepped(api, [first, waiting, third], first_pods[1])

        until_restarting(controller)
        launching = controller.step()
        (request,) = launching.evidence["replacements"]
        assert not request["requested"] and "403" in request["detail"] and "rayclusters" in request["detail"]
        assert "replacement_wait" not in launching.evidence and slept == []  # nothing to wait for
        assert api.deleted == []
        assert isinstance(controller.step(), Restarting)  # the launch failed: decided like any launch failure
        assert recorder.judgements[-1].decision.action == "retry_launch"
        assert recorder.judgements[-1].decision.data_parallel_size == 1
        controller.step()
        controller.step()
        assert third.started_with.data_parallel_size == 1 and third.pods == [first_pods[0]]
