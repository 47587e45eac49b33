"""torchrun's failure summary and Megatron's tracker lines, read from what a real torchrun prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runmgr.ports import rendezvous_port
from runmgr.watch.deaths import classify
from runmgr.watch.torchrun import RejectedResult, root_cause, tracker_lines

# Rank 1 fails as asked; rank 0 waits to be stopped by torchrun (it never finishes by itself).
FAILING = """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    how = sys.argv[1]
    if how == "abort":
        os.abort()  # what an NCCL watchdog does to its process: SIGABRT
    sys.exit(int(how))
while True:
    time.sleep(1)
"""


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


def torchrun_output(tmp_path: Path, how: str) -> str:
    script = tmp_path / "fail.py"
    script.write_text(FAILING)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0",
                           "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                           "--max-restarts", "0", str(script), how],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1  # torchrun's own status when a child fails
    return done.stdout + done.stderr


@pytest.mark.parametrize("code, category", [("16", "rerun"), ("17", "validation")])
def test_the_root_cause_is_the_rank_that_exited_first_with_its_code(tmp_path, code, category):
    text = torchrun_output(tmp_path, code)
    failure = root_cause(text)
    assert failure is not None and (failure.rank, failure.local_rank, failure.exitcode) == (1, 1, int(code))
    assert failure.pid > 0 and failure.host
    assert classify(text).category == category  # rank 0's SIGTERM (exitcode -15) is not taken for the cause


def test_a_sigabrt_like_an_nccl_watchdogs_is_exit_code_minus_6(tmp_path):
    failure = root_cause(torchrun_output(tmp_path, "abort"))
    assert failure is not None and (failure.rank, failure.exitcode) == (1, -6)


def test_text_without_a_summary_has_no_root_cause():
    assert root_cause("Traceback (most recent call last):\nValueError: x") is None


def test_tracker_lines_give_the_rank_device_node_and_iteration():
    text = ("ts=2026-08-22 10:11:12.123456 node=gpu-node-3 device=2 jobID=N/A rank=5 iteration=120 "
            "status=RerunValidationStatus.INITIAL_RUN result=nan message='Unexpected result nan'\n"
            "some other line\n"
            "ts=2026-08-22 10:20:00.000001 node=gpu-node-4 device=0 jobID=77 rank=9 iteration=121 "
            "status=second_rerun_not_reproducible result=inf message='x'\n")
    found = tracker_lines(text)
    assert [(r.node, r.device, r.rank, r.iteration, r.status) for r in found] == [
        ("gpu-node-3", "2", 5, 120, "initial_run"), ("gpu-node-4", "0", 9, 121, "second_rerun_not_reproducible")]
    assert isinstance(found[0], RejectedResult) and found[0].line.startswith("ts=2026-08-22 10:11:12")
