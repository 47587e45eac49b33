"""A folder of runs written with the real Logbook API (sub-runs, incidents,
decisions, checkpoints, a Megatron command, stack dumps, a health report and
strings that try to run script in the page) and the real server over it."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from logbook import Logbook
from logbook.web.app import make_app
from logbook.web.server import bind, make_server, url_of
from tests.logbook.conftest import FakeClock, ScriptedRun, train

SCRIPT_ATTACK = "<script>window.pwned=1</script>"
IMG_ATTACK = '<img src=x onerror="window.pwned=1">'
SKIPPED_TEXT = "decoded sample #12: <b>bold</b> & more"
STACK_TEXT = 'Thread 0x7f (idle): "MainThread"\n    all_reduce (torch/distributed.py:42)\n'


@dataclass
class Folder:
    """The runs folder, the live run's open logbook (the 'driver'), and what was written."""

    root: Path
    live_dir: Path
    book: Logbook
    clock: FakeClock
    incident_ids: list = field(default_factory=list)
    kind_ids: dict = field(default_factory=dict)
    """run5's incidents: kind -> id (one of every kind)."""


def _write_finished(run_dir: Path, clock: FakeClock) -> None:
    with Logbook.open(run_dir, clock=clock) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, {}, {"optim": {"lr": 1e-3}})
        train(book, ScriptedRun(run_dir, clock), "3.00", 1, 20)
        book.end_subrun("3.00", "finished", 20, "reached training.steps")


def _write_live(run_dir: Path, clock: FakeClock) -> tuple[Logbook, list[int]]:
    book = Logbook.open(run_dir, clock=clock)
    run = ScriptedRun(run_dir, clock)
    book.start_subrun("12.00", "launch", {}, None, 0, {}, {"optim": {"lr": 3e-4}, "data": {"skip": []}})
    book.record_event("12.00", "command", "node 0: torchrun --nnodes 1 pretrain_gpt.py --lr 3e-4",
                      {"node_rank": 0, "argv": ["torchrun", "pretrain_gpt.py"]})
    train(book, run, "12.00", 1, 30)
    hang = book.record_incident("12.00", "hang", "no step for 120 s: ranks 0-1 waiting in all_reduce",
                                {"silent_s": 120.0, "last_step": 30, "ranks": [0, 1]}, step=30, ranks=[0, 1])
    book.record_decision("12.00", hang, "restart", "hang: dump stacks, restart from the last checkpoint", {})
    book.end_subrun("12.00", "restarting", 30, "hang")
    (run_dir / "stacks" / "12.00").mkdir(parents=True)
    for rank in (1, 0):
        (run_dir / "stacks" / "12.00" / f"rank{rank}.txt").write_text(f"rank {rank}\n{STACK_TEXT}")
    (run_dir / "health").mkdir()
    (run_dir / "health" / "check-12.01.json").write_text(json.dumps({"node-a": {"ok": True, "gemm_tflops": 12.5}}))
    clock.advance(30)
    book.start_subrun("12.01", IMG_ATTACK, {"health": {"report": "health/check-12.01.json"}},
                      str(run_dir / "checkpoints" / "step_00000020"), 20, {"lr_scale": 0.5},
                      {"optim": {"lr": 1.5e-4}, "data": {"skip": []}})
    train(book, run, "12.01", 21, 50)
    spike = book.record_incident("12.01", "loss_spike", SCRIPT_ATTACK, {"loss": 9.5, "baseline": 2.1, "note": IMG_ATTACK},
                                 step=50)
    book.record_decision("12.01", spike, "rollback_skip", "spike: roll back to 40 and skip its data", {})
    book.end_subrun("12.01", "restarting", 50, "loss spike")
    clock.advance(20)
    book.start_subrun("12.02", "loss spike at step 50", {}, str(run_dir / "checkpoints" / "step_00000040"), 40,
                      {"lr_scale": 0.5, "skip_ranges": [[300, 320]]}, {"optim": {"lr": 1.5e-4},
                                                                       "data": {"skip": [[300, 320]]}})
    train(book, run, "12.02", 41, 45)
    return book, [hang, spike]


def write_every_kind(run_dir: Path, clock: FakeClock) -> dict[str, int]:
    """A finished run with one incident of every kind runmgr's detectors report, each with its
    decision, spread over sub-runs of 10 steps; those a dead or faulty process reports carry no
    step (as runmgr writes them). Returns kind -> incident id."""
    from runmgr.choices import IncidentKind

    kinds = [kind.value for kind in IncidentKind]
    stepless = {"worker_death", "device_fault", "launch_failure", "early_exit", "storage_outage", "hang"}
    ids, run = {}, ScriptedRun(run_dir, clock)
    with Logbook.open(run_dir, clock=clock) as book:
        for index in range(0, len(kinds), 4):
            subrun, first = f"5.{index // 4:02d}", index * 10 // 4
            cause = "launch" if not index else "restart"
            book.start_subrun(subrun, cause, {}, None, first, {}, {"optim": {"lr": 1e-3}})
            train(book, run, subrun, first + 1, first + 10, checkpoint_every=1000)
            for kind in kinds[index:index + 4]:
                step = None if kind in stepless else first + 5
                evidence = {"kind": kind, "time": clock.now, "ranks": [1], "nodes": [NODE],
                            "evidence": {"exit_code": -9, "line": "CUDA error: uncorrectable ECC error"}}
                ids[kind] = book.record_incident(subrun, kind, f"{kind}: rank 1 on {NODE[:8]} reported it", evidence,
                                                 step=step, ranks=[1], nodes=[NODE])
                book.record_decision(subrun, ids[kind], "restart", f"{kind}: restart from the last checkpoint",
                                     {"action": "restart", "restart_from_step": first, "lr_factor": 0.5})
            book.end_subrun(subrun, "restarting" if index + 4 < len(kinds) else "finished", first + 10, "restart")
            clock.advance(5)
    return ids


NODE = "b7d41e09" + "1" * 48
"""A Ray node id (56 hex digits), as incidents name nodes."""


def _folder(root: Path) -> Folder:
    clock = FakeClock()
    _write_finished(root / "run3", clock)
    kinds = write_every_kind(root / "run5", clock)
    book, incidents = _write_live(root / "run12", clock)
    return Folder(root, root / "run12", book, clock, incidents, kinds)


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory) -> Iterator[Folder]:
    """``runs/run12`` (live: its last sub-run is open), ``runs/run3`` (finished) and ``runs/run5``
    (an incident of every kind), one
    folder per test module (tests that add records add a run of their own)."""
    folder = _folder(tmp_path_factory.mktemp("web") / "runs")
    try:
        yield folder
    finally:
        folder.book.close()


@pytest.fixture(scope="module")
def server_url(runs_folder: Folder) -> Iterator[str]:
    """The real server (uvicorn, 127.0.0.1, a free port) over the folder; its base URL."""
    sock = bind("127.0.0.1", 0)
    server = make_server(make_app(runs_folder.root, decode_skipped=lambda run_dir: SKIPPED_TEXT))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield url_of(sock).rstrip("/")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
