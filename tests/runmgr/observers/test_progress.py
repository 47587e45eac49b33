"""The live progress line as a person reads it."""

from __future__ import annotations

import io

from runmgr.controller.judge import Judgement
from runmgr.controller.states import Running
from runmgr.observers.progress import ProgressObserver
from runmgr.policy.decision import Decision
from runmgr.watch.incidents import Incident
from runmgr.workers.group import GroupPoll
from trainer.plan import ResumePlan
from trainer.report import StepReport


def step(number: int) -> StepReport:
    return StepReport("1.00", number, 2.0, 1.0, 1e-3, 1.0, 512, number * 8, 0.1, (0.05, 0.05), False, 1000.0 + number)


def test_an_incident_without_an_onset_step_says_after_which_step_it_was_seen():
    progress = ProgressObserver(200, io.StringIO(), clock=lambda: 0.0)
    running = Running("1.00", ResumePlan(subrun="1.00"), 0)
    progress.on_poll(running, GroupPoll(steps=[step(26), step(27)]))
    death = Incident("worker_death", 1.0, "rank 1 died", subrun="1.00", ranks=(1,))
    progress.on_judgement(running, Judgement(death, Decision("restart", "restart from step 20")))
    assert progress.last_incident == "worker_death after step 27 -> restart"
    assert "None" not in progress.line()
    spike = Incident("loss_spike", 2.0, "loss rose", subrun="1.00", onset_step=25)
    progress.on_judgement(running, Judgement(spike, Decision("rollback_skip", "roll back")))
    assert progress.last_incident == "loss_spike at step 25 -> rollback_skip"
