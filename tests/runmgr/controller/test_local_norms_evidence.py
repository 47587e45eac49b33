"""A persistent spike's incident names the layers whose gradient norm jumped first
and most (the evidence ``local_norms``), from the local norms the ranks reported
before and during it; a new sub-run forgets what the abandoned branch recorded."""

from __future__ import annotations

from runmgr.config.policy import PolicyConfig
from runmgr.config.watcher import SpikeConfig, WatcherConfig
from runmgr.controller.group import GroupPoll
from runmgr.controller.judge import Judge
from runmgr.watch.incidents import LOSS_SPIKE
from runmgr.watch.local_norms import LocalNormsMemory
from runmgr.watch.observations import LocalNormsObservation
from tests.runmgr.controller.fakes import step_report
from trainer.report import LocalNormsReport

SPIKE = SpikeConfig(window=20, min_history=10, grace_steps=5)
ONSET = 30


def norms_at(step: int, subrun: str = "1.00") -> LocalNormsReport:
    """Three weights; from the onset the output layer's norm jumps first (x8), the
    embedding's a step later and harder (x30)."""
    wobble = 1.0 + 0.02 * (step % 3)
    output = 0.5 * wobble * (8.0 if step >= ONSET else 1.0)
    embedding = 1.0 * wobble * (30.0 if step >= ONSET + 1 else 1.0)
    return LocalNormsReport(subrun, step, {"embedding.weight": embedding, "layers.0.mlp.w1.weight": 2.0 * wobble,
                                           "output.weight": output}, float(step))


def test_a_persistent_spike_names_the_weights_that_moved_first_and_most():
    judge = Judge(WatcherConfig(loss_spike=SPIKE, grad_spike=SPIKE), PolicyConfig(), lambda step: [])
    judge.restart_detectors({0: "node-0"})
    found = []
    for step in range(1, ONSET + 10):
        loss = 2.0 + 0.01 * (step % 3) + (3.0 if step >= ONSET else 0.0)
        poll = GroupPoll(steps=[step_report(step, loss)], local_norms=[norms_at(step)])
        found += judge.judge("1.00", poll, [], float(step), step)
    spike = next(j.incident for j in found if j.incident.kind == LOSS_SPIKE)
    evidence = spike.evidence["local_norms"]
    assert spike.onset_step == ONSET and evidence["first_step"] == ONSET
    assert [w["name"] for w in evidence["first"]] == ["output.weight"]
    assert evidence["most"][0]["name"] == "embedding.weight" and evidence["most"][0]["ratio"] > 25
    assert "layers.0.mlp.w1.weight" not in [w["name"] for w in evidence["first"]]


def test_a_new_subrun_forgets_the_norms_the_abandoned_branch_recorded_after_its_start():
    memory = LocalNormsMemory()
    for step in range(1, 41):
        memory.update(LocalNormsObservation.from_report(norms_at(step)))
    memory.note("1.01", 21)  # the re-run's first step report: resumed from checkpoint 20
    assert sorted(memory.series()) == list(range(1, 21))
    memory.update(LocalNormsObservation.from_report(norms_at(21, "1.01")))
    assert max(memory.series()) == 21
    # A poll may bring a later step's norms before the re-run's first step report: the earliest step counts.
    memory.update(LocalNormsObservation.from_report(norms_at(35, "1.02")))
    memory.note("1.02", 22)
    assert sorted(memory.series()) == [*range(1, 22), 35]


def test_an_incident_without_norms_around_its_onset_is_left_as_it_is():
    judge = Judge(WatcherConfig(loss_spike=SPIKE, grad_spike=SPIKE), PolicyConfig(), lambda step: [])
    judge.restart_detectors({0: "node-0"})
    found = []
    for step in range(1, ONSET + 10):
        loss = 2.0 + 0.01 * (step % 3) + (3.0 if step >= ONSET else 0.0)
        found += judge.judge("1.00", GroupPoll(steps=[step_report(step, loss)]), [], float(step), step)
    spike = next(j.incident for j in found if j.incident.kind == LOSS_SPIKE)
    assert "local_norms" not in spike.evidence
