"""A followed Megatron-LM log judged in shadow mode, in-process with an injected clock: what the
logbook records, what runmgr would have done (never done), the job's own restart, the follower's
own restart, and a log written thousands of lines at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.config.compose import load_run_config
from runmgr.shadow.follower import NOT_ACTED_ON, Follower
from runmgr.shadow.lines import FileLines
from tests.runmgr.shadow.megatron_lines import iteration_line, loss_at, saved_lines
from tests.webhook import receiver  # noqa: F401 (a fixture)

JOB_ARGS = ("megatron.args=[--global-batch-size,8,--seq-length,128,--train-iters,200,--lr,3e-4,"
            "--save,/ckpt,--load,/ckpt,--save-interval,10]")
PERSISTENT, RECOVERING = range(60, 80), range(30, 33)


class Job:
    """A Megatron-LM log written line by line, and a clock that moves 0.5 s per 5 iterations."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "train.log"
        self.clock = [1000.0]
        self.config = load_run_config("shadow", [f"run.dir={tmp_path / 'run'}", "watcher=demo", "policy=demo",
                                                 JOB_ARGS])

    def follower(self) -> tuple[Follower, Logbook]:
        book = Logbook.open(self.config.run_dir())
        return Follower(self.config, FileLines(self.log, lambda: self.clock[0]), book, lambda: self.clock[0]), book

    def write(self, iterations: range, follower: Follower, spikes=(PERSISTENT, RECOVERING)) -> list:
        judgements = []
        with self.log.open("a") as handle:
            for iteration in iterations:
                handle.write(iteration_line(iteration, loss_at(iteration, *spikes)) + "\n")
                if iteration % 10 == 0:
                    handle.write("\n".join(saved_lines(iteration)) + "\n")
                handle.flush()
                if iteration % 5 == 0:
                    self.clock[0] += 0.5
                    judgements += follower.poll()
        return judgements


def events(book: Logbook, type_: str, kind: str | None = None) -> list[dict]:
    return [e for e in book.events() if e["type"] == type_ and (kind is None or e.get("kind") == kind)]


def test_a_persistent_spike_is_a_recommended_rollback_with_megatron_s_flags_and_a_recovering_one_is_not(tmp_path):
    job = Job(tmp_path)
    follower, book = job.follower()
    seen = job.write(range(1, 101), follower)
    assert [(j.incident.kind, j.incident.onset_step, j.decision.action) for j in seen] == [
        ("loss_spike", 30, "ignore"), ("loss_spike", 60, "rollback_skip")]
    (start,) = events(book, "subrun_start")
    assert start["evidence"]["shadow"] and NOT_ACTED_ON in start["cause"]
    (recommendation,) = events(book, "event", "recommendation")
    data = recommendation["data"]
    assert not data["acted_on"] and data["action"] == "rollback_skip" and data["restart_from_step"] == 50
    assert data["start_checkpoint"] == "/ckpt/iter_0000050" and NOT_ACTED_ON in recommendation["message"]
    args = data["args"]
    skipped = [int(word) for word in args[args.index("--iterations-to-skip") + 1:] if word.isdigit()]
    # Megatron skips the iterations it lists: a window from before the onset on, the spike's start in it.
    assert skipped == list(range(skipped[0], skipped[-1] + 1)) and skipped[0] <= 60 <= skipped[-1]
    assert "--iterations-to-skip" in recommendation["message"]
    # The job went on (runmgr did nothing): one sub-run, every step recorded, each save a checkpoint.
    assert [s.id for s in book.lineage()] == ["1.00"] and book.lineage()[0].is_open
    assert [row["step"] for row in book.all_metrics()] == list(range(1, 101))
    assert [c["step"] for c in events(book, "checkpoint")] == list(range(10, 101, 10))


def test_a_silence_longer_than_the_learned_step_time_is_a_hang_recommended_once(tmp_path):
    job = Job(tmp_path)
    follower, book = job.follower()
    job.write(range(1, 41), follower, spikes=(range(0), range(0)))
    job.clock[0] += 4.0  # under the learned timeout (5 x 0.5 s, at least the demo watcher's 5 s)
    assert follower.poll() == []
    job.clock[0] += 2.0
    (hang,) = follower.poll()
    assert hang.incident.kind == "hang" and hang.incident.onset_step == 40
    assert hang.decision.action == "dump_and_restart"
    job.clock[0] += 60.0
    assert follower.poll() == []  # one silence, one incident
    (recommendation,) = events(book, "event", "recommendation")
    assert recommendation["data"]["action"] == "dump_and_restart" and "--load" in recommendation["data"]["args"]


def test_a_silence_after_a_decision_taken_mid_poll_is_still_a_hang(tmp_path):
    """The persistent spike is decided at a line in the middle of one poll's lines (a fast log): the
    detectors start afresh there, and the job's silence after the poll's last line is still timed."""
    job = Job(tmp_path)
    follower, book = job.follower()
    with job.log.open("a") as handle:
        handle.write("".join(iteration_line(i, loss_at(i, PERSISTENT, range(0))) + "\n" for i in range(1, 121)))
    judgements = follower.poll()  # every line at once: the spike from 60 is decided at 70 of 120
    assert [j.decision.action for j in judgements if j.decision.action != "ignore"][:1] == ["rollback_skip"]
    job.clock[0] += 60.0
    hangs = [j for j in follower.poll() if j.incident.kind == "hang"]
    assert [(j.incident.onset_step, j.decision.action) for j in hangs] == [(120, "dump_and_restart")]


def test_the_job_restarting_by_itself_is_the_next_sub_run(tmp_path):
    job = Job(tmp_path)
    follower, book = job.follower()
    job.write(range(1, 46), follower, spikes=(range(0), range(0)))
    with job.log.open("a") as handle:
        handle.write(" successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 40\n")
    job.write(range(41, 61), follower, spikes=(range(0), range(0)))
    first, second = book.lineage()
    assert (first.id, first.end_state, first.last_step) == ("1.00", "restarting", 45)
    assert second.id == "1.01" and second.start_step == 40 and "restarted by itself" in second.cause
    assert [r["step"] for r in book.all_metrics() if r["subrun"] == "1.01"] == list(range(41, 61))


def test_a_follower_killed_mid_log_and_restarted_repeats_no_incident_and_misses_none(tmp_path):
    job = Job(tmp_path)
    first, first_book = job.follower()
    before = job.write(range(1, 51), first)  # the recovering spike at 30 is judged by the first follower
    first_book.close()  # killed: no close(), only what each poll committed
    second, book = job.follower()
    after = job.write(range(51, 101), second)
    assert [(j.incident.onset_step, j.decision.action) for j in before] == [(30, "ignore")]
    assert [(j.incident.onset_step, j.decision.action) for j in after] == [(60, "rollback_skip")]
    incidents = events(book, "incident")
    assert [(i["kind"], i["step"]) for i in incidents] == [("loss_spike", 30), ("loss_spike", 60)]
    assert [row["step"] for row in book.all_metrics()] == list(range(1, 101))


def test_the_lines_a_killed_follower_read_after_its_last_save_are_not_recorded_twice(tmp_path):
    job = Job(tmp_path)
    first, first_book = job.follower()
    job.write(range(1, 21), first)
    saved = (job.config.run_dir() / "shadow_state.json").read_text()
    job.write(range(21, 26), first)  # recorded, then killed before its position was saved
    (job.config.run_dir() / "shadow_state.json").write_text(saved)
    first_book.close()
    second, book = job.follower()
    job.write(range(26, 41), second)
    assert [row["step"] for row in book.all_metrics()] == list(range(1, 41))


def test_thousands_of_lines_written_at_once_are_all_taken_in_one_poll(tmp_path):
    job = Job(tmp_path)
    follower, book = job.follower()
    with job.log.open("w") as handle:
        for iteration in range(1, 5001):
            handle.write(iteration_line(iteration, loss_at(iteration, range(0), range(0)), total=5000) + "\n")
    follower.poll()
    assert len(book.all_metrics()) == 5000


def test_runmgr_s_own_trainer_run_by_another_launcher_is_followed_in_its_own_format(tmp_path):
    """``torchrun -m trainer conf=demo | runmgr watch follow - conf=demo``: the lines its
    PrintingReporter prints, a persistent spike recommended as a rollback to the conf's own
    checkpoint directory, and the trainer's start from a checkpoint the next sub-run."""
    import io

    from trainer.cli import PrintingReporter
    from trainer.report import CheckpointReport, StepReport

    config = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "watcher=demo", "policy=demo", "chaos=none"])
    log, clock = tmp_path / "train.log", [1000.0]
    book = Logbook.open(config.run_dir())
    follower = Follower(config, FileLines(log, lambda: clock[0]), book, lambda: clock[0])
    out = io.StringIO()
    reporter = PrintingReporter(train_iters=200, out=out)
    judgements = []
    for iteration in range(1, 101):
        reporter.step(StepReport(subrun="x", step=iteration, loss=loss_at(iteration, PERSISTENT, RECOVERING),
                                 grad_norm=1.0, lr=3e-4, loss_scale=1.0, tokens=512, consumed_samples=8 * iteration,
                                 step_time=0.05, compute_times=(), skipped=False, time=0.0))
        if iteration % 10 == 0:
            reporter.checkpoint(CheckpointReport("x", iteration, f"ck/step_{iteration:08d}", 0.1, 0.0))
        if iteration % 5 == 0:
            log.write_text(out.getvalue())
            clock[0] += 0.5
            judgements += follower.poll()
    acted = [j for j in judgements if j.decision.action != "ignore"]
    assert [(j.incident.kind, j.incident.onset_step, j.decision.action) for j in acted][:1] == [
        ("loss_spike", 60, "rollback_skip")]
    (recommendation, *_) = events(book, "event", "recommendation")
    assert recommendation["data"]["start_checkpoint"] == str(config.checkpoint_dir() / "step_00000050")
    assert [j.incident.onset_step for j in judgements if j.incident.recovered] == [30]
    with log.open("a") as handle:
        handle.write("start at step 50 from ck/step_00000050 | decay: betas (0.9, 0.95), eps 1e-08, wd 0.1\n")
    clock[0] += 0.5
    follower.poll()
    assert [s.start_step for s in book.lineage()] == [0, 50]


def test_a_damaged_position_file_is_one_line_not_a_traceback(tmp_path):
    from runmgr.shadow.follower import ShadowStateError

    job = Job(tmp_path)
    follower, book = job.follower()
    job.write(range(1, 11), follower)
    book.close()
    (job.config.run_dir() / "shadow_state.json").write_text("{not json")
    with pytest.raises(ShadowStateError, match="cannot be read"):
        job.follower()


def test_a_job_its_scheduler_cancelled_is_stopped_not_hung_and_its_resubmission_is_the_next_sub_run(tmp_path):
    job = Job(tmp_path)
    follower, book = job.follower()
    job.write(range(1, 41), follower, spikes=(range(0), range(0)))
    with job.log.open("a") as handle:
        handle.write("slurmstepd: error: *** STEP 4471203.0 ON gpu-node-017 CANCELLED AT 2025-06-11T09:37:34 ***\n"
                     "W0611 09:37:34.583000 54287 torch/distributed/elastic/agent/server/api.py:704] Received "
                     "Signals.SIGTERM death signal, shutting down workers\n")
    assert follower.poll() == []
    job.clock[0] += 1800.0  # resubmitted half an hour later
    assert follower.poll() == []
    job.write(range(41, 51), follower, spikes=(range(0), range(0)))
    first, second = book.lineage()
    assert first.end_state == "stopped" and "CANCELLED AT" in first.end_reason and first.last_step == 40
    assert second.is_open and events(book, "incident") == []


def test_an_abort_is_recommended_without_a_restart_command(tmp_path):
    job = Job(tmp_path)
    job.config = load_run_config("shadow", [f"run.dir={tmp_path / 'run'}", "watcher=demo", "policy=demo", JOB_ARGS,
                                            "policy.instability.ladder=[{action: rollback_skip, max_uses: 0}]"])
    follower, book = job.follower()
    judgements = job.write(range(1, 120), follower, spikes=(range(60, 120), range(0)))
    assert any(j.decision.action == "abort" for j in judgements), [j.decision.action for j in judgements]
    (abort,) = [e for e in events(book, "event", "recommendation") if e["data"]["action"] == "abort"]
    assert abort["data"]["plan"] is None and abort["data"]["args"] == []


def test_a_recommendation_recorded_but_never_sent_is_sent_by_the_restarted_follower_once(
        tmp_path, receiver, monkeypatch):
    """A follower killed between recording a recommendation and its webhook's delivery (the
    delivery runs on a thread of its own) leaves it untold; the next follower tells it, once."""
    from runmgr.notify.observer import NotifyObserver

    monkeypatch.setenv("RUNMGR_TEST_HOOK", receiver.url)
    job = Job(tmp_path)
    job.config = load_run_config("shadow", [f"run.dir={tmp_path / 'run'}", "watcher=demo", "policy=demo", JOB_ARGS,
                                            "notify.webhook=env:RUNMGR_TEST_HOOK", "notify.backoff_s=0.01"])

    def follower() -> tuple[Follower, Logbook, NotifyObserver]:
        book = Logbook.open(job.config.run_dir())
        notify = NotifyObserver(job.config, book)
        return (Follower(job.config, FileLines(job.log, lambda: job.clock[0]), book, lambda: job.clock[0],
                         notify=notify), book, notify)

    first, first_book = job.follower()  # its notifier never got to send: as killed before the delivery
    job.write(range(1, 81), first)
    (recommendation,) = events(first_book, "event", "recommendation")
    first_book.close()
    second, book, notify = follower()
    job.write(range(81, 91), second)
    notify.close()
    (body,) = receiver.bodies
    assert body["kind"] == "recommendation" and body["decision"]["action"] == "rollback_skip"
    assert body["summary"] == recommendation["message"] and body["incident"]["onset_step"] == 60
    (told,) = events(book, "event", "notified")
    assert told["data"]["about_seq"] == recommendation["seq"]
    book.close()
    third, book, notify = follower()  # restarted again: told already, so told no more
    job.write(range(91, 101), third)
    notify.close()
    assert len(receiver.bodies) == 1
    book.close()
