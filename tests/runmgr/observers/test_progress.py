"""The live progress line as a person reads it."""

from __future__ import annotations

import io

from runmgr.controller.judgement import Judgement
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


def test_the_line_shows_tokens_per_second_mfu_and_the_largest_rank_s_peak_memory():
    progress = ProgressObserver(200, io.StringIO(), clock=lambda: 0.0)
    running = Running("1.00", ResumePlan(subrun="1.00"), 0)
    measured = StepReport("1.00", 5, 2.0, 1.0, 1e-3, 1.0, 512, 40, 0.1, (0.05, 0.05), False, 1005.0,
                          tokens_per_s=5120.0, mfu=0.412, peak_memory_bytes=(3 << 30, 5 << 29))
    progress.on_poll(running, GroupPoll(steps=[measured]))
    assert "5,120 tok/s | MFU 41.2% | peak mem 3.00 GiB |" in progress.line()
    cpu = StepReport("1.00", 6, 2.0, 1.0, 1e-3, 1.0, 512, 48, 0.1, (0.05, 0.05), False, 1006.0, tokens_per_s=5120.0)
    progress.on_poll(running, GroupPoll(steps=[cpu]))
    assert "MFU n/a | peak mem n/a" in progress.line()  # CPU: no known peak FLOP/s


def test_a_report_of_an_older_trainer_still_reads():
    old = step(3).to_dict()
    for key in ("tokens_per_s", "mfu", "peak_memory_bytes"):
        old.pop(key)
    report = StepReport.from_dict({**old, "a_later_field": 1})
    assert report.mfu is None and report.peak_memory_bytes == () and report.tokens_per_s is None
    assert StepReport.from_dict(step(3).to_dict()) == step(3)
