"""The calls on a labelled log counted as a person would: each label found or missed, how late,
whether what runmgr would have done is the labelled remedy, and every other incident a false
alarm, counted apart when it would have acted."""

from __future__ import annotations

from runmgr.controller.judgement import Judgement
from runmgr.policy.decision import Decision
from runmgr.score.labels import Label, LogLabels
from runmgr.score.playback import Call
from runmgr.score.tally import Corpus, score_log
from runmgr.watch.incidents import Incident

TIMES = {step: 1000.0 + 10 * step for step in range(1, 1001)}
SPIKE = Label("spike_persistent", ("loss_spike", "grad_spike"), 500, ("rollback_skip",))
RECOVERING = Label("spike_recovering", ("loss_spike",), 200, ("ignore",))


def call(kind: str, onset: int, action: str, decided_at_step: int) -> Call:
    return Call(Judgement(Incident(kind, 0.0, "seen", onset_step=onset), Decision(action, "because")),
                decided_at_step, TIMES[decided_at_step])


def labels(*incidents: Label) -> LogLabels:
    return LogLabels("a log", "megatron_lm", incidents)


def test_the_first_acting_call_on_a_label_is_what_runmgr_did_and_its_companions_are_no_false_alarms():
    calls = [call("grad_spike", 500, "ignore", 550), call("loss_spike", 498, "rollback_skip", 550)]
    score = score_log("a.log", labels(SPIKE), calls, TIMES)
    (outcome,) = score.outcomes
    assert outcome.found is calls[0] and outcome.action == "rollback_skip" and outcome.right
    assert outcome.delay_steps == 50 and outcome.delay_s == 500.0
    assert score.false_alarms == () and score.steps == 1000


def test_a_call_outside_the_label_s_window_or_of_another_kind_is_a_false_alarm_and_the_label_missed():
    calls = [call("loss_spike", 470, "rollback_skip", 520), call("hang", 500, "dump_and_restart", 500),
             call("loss_spike", 701, "lower_lr", 751)]
    score = score_log("a.log", labels(SPIKE), calls, TIMES)
    (outcome,) = score.outcomes
    assert outcome.found is None and outcome.action == "ignore" and not outcome.right
    assert [c.judgement.incident.kind for c in score.false_alarms] == ["loss_spike", "hang", "loss_spike"]


def test_a_self_recovering_spike_left_alone_is_right_found_or_not():
    found = score_log("a.log", labels(RECOVERING), [call("loss_spike", 200, "ignore", 229)], TIMES)
    unseen = score_log("b.log", labels(RECOVERING), [], TIMES)
    assert found.outcomes[0].right and found.outcomes[0].found is not None
    assert unseen.outcomes[0].right and unseen.outcomes[0].found is None
    rows = Corpus([found, unseen]).classes()
    assert [(r.cls, r.labelled, r.found, r.missed, r.right, r.delays_steps) for r in rows] == [
        ("spike_recovering", 2, 1, 1, 2, [29])]


def test_false_alarms_are_counted_by_kind_with_those_on_clean_runs_and_those_that_acted():
    clean = score_log("clean.log", labels(), [call("loss_spike", 100, "ignore", 130),
                                              call("slowdown", 300, "restart", 320)], TIMES)
    spiky = score_log("spiky.log", labels(SPIKE), [call("loss_spike", 100, "rollback_skip", 150)], TIMES)
    corpus = Corpus([clean, spiky])
    assert [(a.kind, a.all, a.acted, a.on_clean, a.acted_on_clean) for a in corpus.false_alarms()] == [
        ("loss_spike", 2, 1, 1, 0), ("slowdown", 1, 1, 1, 1)]
    assert corpus.clean_steps() == 1000


def test_of_two_labels_whose_windows_hold_an_incident_the_nearest_onset_explains_it():
    calls = [call("loss_spike", 100, "ignore", 104), call("loss_spike", 200, "rollback_skip", 250)]
    early = Label("spike_recovering", ("loss_spike",), 100, ("ignore",))
    late = Label("spike_persistent", ("loss_spike",), 200, ("rollback_skip",))
    score = score_log("a.log", labels(early, late), calls, TIMES)
    assert [(o.label.cls, o.found, o.right) for o in score.outcomes] == [
        ("spike_recovering", calls[0], True), ("spike_persistent", calls[1], True)]
