"""A recorded log followed as a live follower would have followed it: its hangs found when a
follower polling every 0.2 s would have found them (the learned timeout after the last line), not
at the next line, and not at all when the job went on in time."""

from __future__ import annotations

import pytest

from logbook import Logbook
from runmgr.config.compose import load_run_config
from runmgr.score.playback import POLL_S, play
from runmgr.score.timeline import PlayedLog, timed_lines
from tests.runmgr.score.played_logs import STEP_S, Log

STEP_TIMEOUT_S = 60.0
"""5 x the longest 10 s step, clamped to the default watcher's 60 s floor for a step."""


def followed(tmp_path, log: Log, silence_at_end_s: float = 0.0):
    config = load_run_config("shadow", [f"run.dir={tmp_path / 'run'}"])
    source = PlayedLog(timed_lines(log.lines), "train.log", now=0.0)
    with Logbook.open(tmp_path / "run", clock=source.clock) as book:
        calls = play(config, source, book, silence_at_end_s)
        return calls, book.lineage()


def test_a_log_that_ends_in_a_silence_is_a_hang_at_the_learned_timeout(tmp_path):
    log = Log().train(range(1, 101))
    last_line_at = log.now
    (call,), _ = followed(tmp_path, log, silence_at_end_s=1800)
    assert call.judgement.incident.kind == "hang" and call.judgement.incident.onset_step == 100
    assert call.judgement.decision.action == "dump_and_restart" and call.step == 100
    assert call.at - last_line_at == pytest.approx(STEP_TIMEOUT_S + POLL_S)


def test_a_silence_the_job_outlived_is_no_hang(tmp_path):
    calls, _ = followed(tmp_path, Log().train(range(1, 101)), silence_at_end_s=STEP_TIMEOUT_S - STEP_S)
    assert calls == []
    calls, _ = followed(tmp_path / "2", Log().train(range(1, 101)).silent(STEP_TIMEOUT_S - STEP_S).train(range(101, 120)))
    assert calls == []


def test_a_hang_its_launcher_restarted_is_found_before_the_restart_and_the_restart_is_the_next_sub_run(tmp_path):
    log = Log().train(range(1, 121))
    hung_at = log.now
    log.silent(1800).restart_from(100).train(range(101, 160))
    (call,), lineage = followed(tmp_path, log)
    assert call.judgement.incident.kind == "hang" and call.judgement.incident.onset_step == 120
    assert call.at - hung_at == pytest.approx(STEP_TIMEOUT_S + POLL_S)
    assert [s.id for s in lineage] == ["1.00", "1.01"] and lineage[1].start_step == 100


def test_a_persistent_spike_is_decided_where_a_follower_would_have_decided_it(tmp_path):
    calls, _ = followed(tmp_path, Log().train(range(1, 301), lifted=range(200, 301)))
    acted = [c for c in calls if c.judgement.decision.action != "ignore"]
    assert acted and acted[0].judgement.incident.kind == "loss_spike"
    assert acted[0].judgement.incident.onset_step == 200 and acted[0].judgement.decision.restart_from_step == 100  # the margin: 100 steps before the onset
    assert acted[0].step == 200 + 50  # at the end of its 50-step grace
