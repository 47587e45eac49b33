"""What of a run reaches its webhooks, through the observer a launch and a follower use: a run
that stopped for a person; every incident only when asked; the logbook's record of each delivery,
which names the webhook by its label, never its URL."""

from __future__ import annotations

from logbook import Logbook
from runmgr.config.compose import load_run_config
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Failed, Launching, Running
from runmgr.notify.observer import NotifyObserver
from runmgr.policy.decision import Decision
from runmgr.watch.incidents import Incident
from tests.webhook import receiver  # noqa: F401 (a fixture)
from trainer.plan import ResumePlan

SPIKE = Judgement(Incident(kind="loss_spike", time=5.0, description="loss rose to 9 at step 60", subrun="1.00",
                           onset_step=60),
                  Decision(action="rollback_skip", reason="persistent", restart_from_step=50))


def observer_of(tmp_path, receiver, monkeypatch, *more) -> tuple[NotifyObserver, Logbook]:
    monkeypatch.setenv("RUNMGR_TEST_HOOK", receiver.url)
    config = load_run_config("demo", [f"run.dir={tmp_path}", "notify.webhook=env:RUNMGR_TEST_HOOK",
                                      "notify.backoff_s=0.01", *more])
    book = Logbook.open(tmp_path)
    book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
    return NotifyObserver(config, book), book


def test_a_run_stopped_for_a_person_is_told_once_and_the_logbook_says_who_was_told(tmp_path, receiver, monkeypatch):
    observer, book = observer_of(tmp_path, receiver, monkeypatch)
    running = Running("1.00", ResumePlan(subrun="1.00"), 0)
    observer.on_judgement(running, SPIKE)  # runmgr handles a spike by itself: no one is told
    observer.on_transition(running, Failed("1.00", "the restart budget is spent (20 of 20)", 40))
    observer.close()
    (body,) = receiver.bodies
    assert body["kind"] == "needs_person" and "restart budget is spent" in body["text"]
    assert body["details"] == {"last_step": 40}
    (told,) = [e for e in book.events() if e["type"] == "event" and e["kind"] == "notified"]
    assert told["data"] == {"webhook": "webhook 1 (env:RUNMGR_TEST_HOOK)", "kind": "needs_person", "attempts": 1}
    assert receiver.url not in str(book.events())


def test_every_incident_is_told_only_when_asked(tmp_path, receiver, monkeypatch):
    observer, _ = observer_of(tmp_path, receiver, monkeypatch, "notify.every_incident=true")
    observer.on_transition(None, Launching("1.00", ResumePlan(subrun="1.00"), 0, "launch"))
    observer.on_judgement(Running("1.00", ResumePlan(subrun="1.00"), 0), SPIKE)
    observer.close()
    (body,) = receiver.bodies
    assert body["kind"] == "incident" and body["incident"]["onset_step"] == 60
    assert body["decision"]["action"] == "rollback_skip"


def test_a_shadow_recommendation_is_told_when_its_kind_is_chosen(tmp_path, receiver, monkeypatch):
    observer, _ = observer_of(tmp_path, receiver, monkeypatch, "notify.shadow_kinds=[hang]")
    observer.on_recommendation("1.00", SPIKE, "not acted on (shadow): runmgr would rollback_skip")
    observer.close()
    assert receiver.bodies == []
    observer, _ = observer_of(tmp_path / "all", receiver, monkeypatch)
    observer.on_recommendation("1.00", SPIKE, "not acted on (shadow): runmgr would rollback_skip")
    observer.close()
    (body,) = receiver.bodies
    assert body["kind"] == "recommendation" and body["summary"].startswith("not acted on (shadow)")


def test_a_restarted_follower_resends_only_the_untold_recommendation_under_its_first_id(tmp_path, receiver,
                                                                                      monkeypatch):
    observer, book = observer_of(tmp_path, receiver, monkeypatch)
    told_seq = book.record_event("1.00", "recommendation", "runmgr would rollback_skip",
                                 {"action": "rollback_skip", "incident_kind": "loss_spike", "step": 30})
    observer.on_recommendation("1.00", SPIKE, "runmgr would rollback_skip", about_seq=told_seq)
    observer.close()  # delivered and recorded
    untold_seq = book.record_event("1.00", "recommendation", "runmgr would lower_lr",
                                   {"action": "lower_lr", "incident_kind": "loss_spike", "step": 60})
    # The follower was killed here, before it sent the second; the one that takes over reads the logbook.
    restarted = NotifyObserver(observer.config, book)
    assert restarted.resend_untold(book.events()) == 1
    restarted.close()
    first, resent = receiver.bodies
    assert first["id"] == f"demo/entry-{told_seq}" and resent["id"] == f"demo/entry-{untold_seq}"
    assert resent["decision"]["action"] == "lower_lr" and "resent" in resent["details"]
