"""``runmgr watch follow`` as a user runs it beside a job: a real follower process on a log that a
job (here the test) writes line by line, killed -9 and restarted mid-log; the same log on
standard input; bad input in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logbook import Logbook
from tests import cli
from tests.runmgr.shadow.megatron_lines import iteration_line, loss_at, saved_lines
from tests.runmgr.shadow.test_follower import JOB_ARGS
from tests.webhook import receiver  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[3]
SPIKES = (range(60, 80), range(30, 33))
LATER_SPIKE = range(100, 116)


def settings(tmp_path: Path) -> list[str]:
    return [f"run.dir={tmp_path / 'run'}", "watcher=demo", "policy=demo", JOB_ARGS, "metrics.enabled=false",
            "notify.webhook=env:RUNMGR_TEST_HOOK", "notify.backoff_s=0.05"]


def hooked(receiver) -> dict:
    """The follower's environment: the webhook's URL in it, never on its command line."""
    return {**os.environ, "RUNMGR_TEST_HOOK": receiver.url}


def told(receiver) -> list[tuple[str, str]]:
    return [(body["kind"], body["decision"]["action"]) for body in receiver.bodies]


def told_once_each(receiver) -> list[tuple[str, str]]:
    """What a receiver that deduplicates by ``id`` (as a pager does) shows, in order of arrival."""
    shown: dict[str, tuple[str, str]] = {}
    for body in receiver.bodies:
        shown.setdefault(body["id"], (body["kind"], body["decision"]["action"]))
    return list(shown.values())


def write(log: Path, iterations: range, spikes=SPIKES) -> float:
    """The job's lines for ``iterations``; when the last was written."""
    with log.open("a") as handle:
        for iteration in iterations:
            lifted = iteration in LATER_SPIKE
            loss = loss_at(iteration, *spikes) * (5.0 if lifted else 1.0)  # the curve is lower by then: a clear rise
            handle.write(iteration_line(iteration, loss) + "\n")
            if iteration % 10 == 0:
                handle.write("\n".join(saved_lines(iteration)) + "\n")
            handle.flush()
            time.sleep(0.01)  # a job's pace: the follower learns its step time from the lines' arrival
    return time.time()


def recorded(run_dir: Path, type_: str) -> list[dict]:
    if not (run_dir / "logbook.sqlite").exists():
        return []
    with Logbook.open(run_dir, create=False) as book:
        return [e for e in book.events() if e["type"] == type_]


def last_step(run_dir: Path) -> int:
    if not (run_dir / "logbook.sqlite").exists():
        return 0
    with Logbook.open(run_dir, create=False) as book:
        return max((row["step"] for row in book.all_metrics()), default=0)


def wait_for(what, timeout: float = 120.0):
    """Polls the follower's own logbook until ``what()`` holds (the bound is for a stuck follower)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("the follower never recorded it")


def test_a_live_log_s_spike_is_recommended_as_it_is_written_and_a_restarted_follower_repeats_nothing(
        tmp_path, receiver):
    log, run_dir = tmp_path / "train.log", tmp_path / "run"
    args = ["watch", "follow", str(log), *settings(tmp_path)]
    follower = cli.start_runmgr(args, ROOT, hooked(receiver), tmp_path / "follower.log")
    try:
        write(log, range(1, 51))
        wait_for(lambda: last_step(run_dir) >= 50)
        written = write(log, range(51, 71))  # the spike from 60 is persistent at 70 (the 10-step grace)
        spike = wait_for(lambda: [e for e in recorded(run_dir, "incident") if e["step"] == 60])
        print(f"the persistent spike recorded {spike[0]['time'] - written:.2f} s after its deciding line was written")
        follower.kill()  # -9, mid-log
        follower.wait()
        write(log, range(71, 81))  # written while no one follows
        follower = cli.start_runmgr(args, ROOT, hooked(receiver), tmp_path / "follower.log")
        write(log, range(81, 131))
        wait_for(lambda: [e for e in recorded(run_dir, "incident") if e["step"] == 100])
        # Then the job falls silent: a hang once the learned step time is far exceeded.
        hang = wait_for(lambda: [e for e in recorded(run_dir, "incident") if e["kind"] == "hang"])
        assert hang[0]["step"] == 130
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=60) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
    incidents = [(e["kind"], e["step"]) for e in recorded(run_dir, "incident")]
    assert incidents == [("loss_spike", 30), ("loss_spike", 60), ("loss_spike", 100), ("hang", 130)]
    recommendations = [e for e in recorded(run_dir, "event") if e["kind"] == "recommendation"]
    assert [r["data"]["action"] for r in recommendations] == ["rollback_skip", "lower_lr", "dump_and_restart"]
    with Logbook.open(run_dir, create=False) as book:
        assert [row["step"] for row in book.all_metrics()] == list(range(1, 131))
    shown = cli.runmgr("logbook", "show", str(run_dir))
    assert shown.returncode == 0 and "not acted on (shadow)" in shown.stdout, shown.stdout + shown.stderr
    # A person was told of each recommendation once, the restart notwithstanding: delivery is at
    # least once, so the one POST the kill may have caught between its answer and its record is sent
    # again, under the same id (one sender thread: no more than one is ever in that gap).
    assert told_once_each(receiver) == [("recommendation", "rollback_skip"), ("recommendation", "lower_lr"),
                                        ("recommendation", "dump_and_restart")]
    assert len(receiver.bodies) <= 4, told(receiver)
    # The URL is nowhere.
    assert receiver.url not in (tmp_path / "follower.log").read_text() + str(recorded(run_dir, "event"))


def test_the_same_log_on_standard_input_is_judged_the_same_and_its_end_ends_the_sub_run(tmp_path, receiver):
    log, run_dir = tmp_path / "train.log", tmp_path / "run"
    write(log, range(1, 101))
    with log.open() as lines:
        done = subprocess.run([sys.executable, "-m", "runmgr", "watch", "follow", "-", *settings(tmp_path)],
                              stdin=lines, capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env=hooked(receiver))
    assert done.returncode == 0, done.stderr
    assert "loss_spike at step 60" in done.stdout and "rollback_skip (not acted on (shadow))" in done.stdout
    incidents = [(e["kind"], e["step"]) for e in recorded(run_dir, "incident")]
    assert incidents == [("loss_spike", 30), ("loss_spike", 60)]
    with Logbook.open(run_dir, create=False) as book:
        (subrun,) = book.lineage()
    assert subrun.end_state == "stopped" and subrun.last_step == 100
    assert told(receiver) == [("recommendation", "rollback_skip")]  # sent before the follower exits


@pytest.mark.parametrize("args, words", [
    (["watch", "follow", "/no/such/folder/train.log"], "no such folder: /no/such/folder"),
    (["watch", "follow", "-", "trainer.kind=deepspeed"], "trainer.kind"),
    (["watch", "follow", "-", "--poll-interval", "0"], "must be above 0"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    done = cli.runmgr(*args, f"run.dir={tmp_path}" if "--poll-interval" not in args else "run.dir=x", cwd=tmp_path)
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr
