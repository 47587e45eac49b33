"""The held-out check of shadow mode (issue 30): a Megatron-LM log written line by line by a
process of its own (`runmgr watch play`, at 1,000 times its pace: tests/data/live, a log the
detectors' corpus does not hold) with a self-recovering spike at iteration 150, a persistent one
from 300 and nothing after 360, followed by a real `runmgr watch follow` process that notifies a
webhook receiver on 127.0.0.1. The persistent spike is recommended as a rollback naming the
checkpoint and the iterations to skip, the recovering one is recorded and left alone, the silence
is a hang once it outlasts the step time the follower learned, and each notification arrives
once; the same with the log on standard input. bench/follow_latency.py measures how soon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.score.play_command import play
from runmgr.score.timeline import timed_lines
from tests.webhook import Receiver, receiver  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[3]
LIVE_LOG = ROOT / "tests" / "data" / "live" / "megatron_spikes_and_hang.log"
SPEED = 1000.0
"""The log's 30 minutes in 1.8 s (README's 300 took 6 s of each test's wait): its lines are 5 ms
apart, so the follower, polling every 0.2 s, still reads them in many polls and learns the same
step time as at 300 (its 2 s floor: the largest gap it sees is a poll's)."""
JOB = ("megatron.args=[--global-batch-size,256,--seq-length,4096,--train-iters,1000,--lr,3e-4,"
       "--save,/shared/ckpt/llama-70b,--load,/shared/ckpt/llama-70b,--save-interval,50]")

pytestmark = pytest.mark.slow


def follow_args(run_dir: Path, source: str, url: str) -> list[str]:
    # The played log's steps last 17 ms: the default one-minute floor of a step's silence would
    # make the hang wait a minute; 2 s is still 10 x the follower's 0.2 s poll.
    return [sys.executable, "-m", "runmgr", "watch", "follow", source, "conf=shadow", f"run.dir={run_dir}", JOB,
            "watcher.hang.step.min_s=2", f"notify.webhook={url}"]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def started(follower: subprocess.Popen) -> str:
    """The follower's first line, once it is following (before a line is written)."""
    banner = follower.stdout.readline()
    assert "in shadow mode" in banner, banner + follower.stderr.read()
    return banner


def stop(follower: subprocess.Popen) -> str:
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err[-3000:]
    return out


def incidents(run_dir: Path) -> list[dict]:
    with Logbook.open(run_dir, create=False) as book:
        return [e for e in book.events() if e["type"] == "incident"]


def decisions(run_dir: Path) -> dict[int, str]:
    """Incident id -> the action decided on it."""
    with Logbook.open(run_dir, create=False) as book:
        return {e["incident_id"]: e["action"] for e in book.events() if e["type"] == "decision"}


def recommendations(run_dir: Path) -> list[dict]:
    with Logbook.open(run_dir, create=False) as book:
        return [e for e in book.events() if e["type"] == "event" and e.get("kind") == "recommendation"]


def assert_the_story(run_dir: Path, hook: Receiver) -> None:
    found = {(e["kind"], e["step"]): e for e in incidents(run_dir)}
    assert set(found) == {("loss_spike", 150), ("loss_spike", 300), ("hang", 360)}
    assert found[("loss_spike", 150)]["evidence"]["recovered"] is True
    decided = decisions(run_dir)
    assert {key: decided[e["id"]] for key, e in found.items()} == {
        ("loss_spike", 150): "ignore", ("loss_spike", 300): "rollback_skip", ("hang", 360): "dump_and_restart"}
    rollback, hang = recommendations(run_dir)
    assert rollback["data"]["action"] == "rollback_skip" and rollback["step"] == 300
    assert rollback["data"]["start_checkpoint"] == "/shared/ckpt/llama-70b/iter_0000200"
    args = rollback["data"]["args"]
    assert args[args.index("--ckpt-step") + 1] == "200" and "--iterations-to-skip" in args
    assert hang["data"]["action"] == "dump_and_restart" and hang["step"] == 360
    told = [(body["incident"]["kind"], body["incident"]["onset_step"]) for body in hook.bodies]
    assert sorted(told) == [("hang", 360), ("loss_spike", 300)]  # each once; the recovered spike not at all
    assert all(body["kind"] == "recommendation" and "not acted on" in body["text"] for body in hook.bodies)


def test_a_log_written_line_by_line_by_another_process_is_followed_and_each_call_told_once(tmp_path, receiver):
    log, run_dir = tmp_path / "train.log", tmp_path / "beside"
    follower = subprocess.Popen(follow_args(run_dir, str(log), receiver.url), cwd=tmp_path, env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started(follower)
        player = subprocess.run([sys.executable, "-m", "runmgr", "watch", "play", str(LIVE_LOG), str(log),
                                 "--speed", str(SPEED)], cwd=tmp_path, env=env(), timeout=300)
        assert player.returncode == 0
        receiver.wait_for(2, timeout=120)  # the rollback's and the hang's: the silence goes on until then
        out = stop(follower)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert "secret-token" not in out
    assert_the_story(run_dir, receiver)
    # Against the times the follower read the lines (the logbook's rows): bench/follow_latency.py
    # measures from when they were written.
    with Logbook.open(run_dir, create=False) as book:
        read_at = {row["step"]: row["time"] for row in book.all_metrics()}
    hang = next(e for e in incidents(run_dir) if e["kind"] == "hang")
    timeout_s = float(hang["evidence"]["description"].split("timeout ")[1].split(" s")[0])
    assert hang["time"] - read_at[360] > timeout_s  # never before the learned timeout
    spike = next(e for e in incidents(run_dir) if e["kind"] == "loss_spike" and e["step"] == 300)
    assert spike["time"] >= read_at[350]  # decided by iteration 350's line: the end of its 50-step grace


def test_the_same_log_on_standard_input_tells_the_same_story(tmp_path, receiver):
    run_dir = tmp_path / "beside"
    follower = subprocess.Popen(follow_args(run_dir, "-", receiver.url), cwd=tmp_path, env=env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started(follower)
        play(timed_lines(LIVE_LOG.read_text().splitlines()), follower.stdin, SPEED)
        receiver.wait_for(2, timeout=120)  # the pipe stays open and silent: a hang, not the stream's end
        # communicate() closes the pipe: now the stream ends, the follower ends the sub-run and exits by itself.
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err[-3000:]
    assert "the followed stream ended" in out
    assert_the_story(run_dir, receiver)
