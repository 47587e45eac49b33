"""The rung for an S3 outage: training goes on, the local copies stay, nothing is spent."""

from __future__ import annotations

from runmgr.config.policy import PolicyConfig
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.decision import IGNORE, KEEP_LOCAL, RESTART
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.watch.incidents import STORAGE_OUTAGE, WORKER_DEATH, Incident

CHECKPOINTS = (VerifiedCheckpoint(10, 80),)


def outage(subrun: str = "1.00") -> Incident:
    return Incident(STORAGE_OUTAGE, 160.0, "S3 uploads have failed for 60 s", subrun=subrun, onset_step=20,
                    evidence={"failed_s": 60.0, "failures": 4, "pending_steps": [20, 30], "last_error": "refused"})


def test_an_outage_keeps_training_and_the_local_copies_and_spends_no_budget():
    decision = decide(outage(), History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == KEEP_LOCAL and not decision.restarts and not decision.exclude_nodes
    assert "training goes on" in decision.reason and "steps 20, 30" in decision.reason
    history = History().record(outage(), decision, CHECKPOINTS)
    assert history.fault_restarts() == 0 and history.stuck_restarts(10) == []


def test_its_recovery_is_recorded():
    recovered = Incident(STORAGE_OUTAGE, 250.0, "S3 answers again", onset_step=20, recovered=True,
                         evidence={"outage_s": 150.0, "pending_steps": []})
    decision = decide(recovered, History(), PolicyConfig(), CHECKPOINTS)
    assert decision.action == IGNORE
    assert "out for 150 s" in decision.reason and "every checkpoint is on S3 again" in decision.reason


def test_an_outage_during_a_subrun_that_is_ending_is_still_decided_on_its_own():
    death = Incident(WORKER_DEATH, 150.0, "rank 1 died", subrun="1.00", ranks=(1,),
                     evidence={"cause": "sigkill", "category": "killed"})
    history = History()
    first = decide(death, history, PolicyConfig(), CHECKPOINTS)
    assert first.action == RESTART
    history = history.record(death, first, CHECKPOINTS)
    assert decide(outage("1.00"), history, PolicyConfig(), CHECKPOINTS).action == KEEP_LOCAL
