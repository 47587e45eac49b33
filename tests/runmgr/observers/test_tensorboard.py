"""The TensorBoard observer fed by the controller stepped over fake worker groups, its
event files read back with TensorBoard's own EventAccumulator: each sub-run is a
TensorBoard run of its own steps and values, its incidents and decisions are text at
their steps, and a rollback's repeated steps never share a run (no zig-zag)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr.config import metrics as metrics_config
from runmgr.config.compose import load_run_config
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Finished, Launching, Running
from runmgr.errors import ConfigError
from runmgr.observers.tensorboard import INCIDENTS_TAG, SUBRUNS_TAG, TensorBoardObserver
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation
from runmgr.wiring import build_observers
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report
from trainer.plan import ResumePlan
from trainer.report import StepReport

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

LOSS = {"1.00": 2.0, "1.01": 3.0, "1.02": 4.0}
"""Each sub-run's loss, so a value read back names the sub-run that wrote it."""


def steps(subrun: str, first: int, last: int) -> list[StepReport]:
    return [step_report(s, loss=LOSS[subrun] + s / 1000, subrun=subrun) for s in range(first, last + 1)]


def run_with_a_death_and_a_device_fault(log_dir: Path) -> object:
    """1.00 trains to 25 and loses rank 1 (restart from 20); 1.01 trains 21-28 and node1 reports
    an ECC error (excluded); 1.02 trains 21-30 again and finishes."""
    groups = [FakeGroup([GroupPoll(steps=steps("1.00", 1, 20)), GroupPoll(steps=steps("1.00", 21, 25),
                                                                          failures=[died(1)])]),
              FakeGroup([GroupPoll(steps=steps("1.01", 21, 28))]),
              FakeGroup([GroupPoll(steps=steps("1.02", 21, 30)), GroupPoll(finished_ranks=[0])])]
    twenty = ResumePoint("/run/checkpoints/step_00000020", 20)
    points = {25: twenty, 28: twenty}
    board = TensorBoardObserver(log_dir)
    controller, _ = make_controller(groups, points=points, slots={"node0": 1, "node1": 1}, observers=(board,))
    ecc = [DeviceObservation("node1", 0, "ecc", 2000.0, correctable=0, uncorrectable=2)]
    controller.read_devices = lambda: ecc if controller.state.subrun == "1.01" else []
    final = controller.run()
    board.close()
    return final


def read(run: Path):
    accumulator = event_accumulator.EventAccumulator(str(run), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def texts(accumulator, tag: str) -> list[tuple[int, str]]:
    """(step, text) of each text event of ``tag`` (torch's add_text files it under ``<tag>/text_summary``)."""
    return [(event.step, event.tensor_proto.string_val[0].decode())
            for event in accumulator.Tensors(f"{tag}/text_summary")]


def test_each_sub_run_is_a_tensorboard_run_of_its_own_steps_and_values(tmp_path):
    final = run_with_a_death_and_a_device_fault(tmp_path / "tensorboard")
    assert isinstance(final, Finished) and final.last_step == 30
    assert sorted(p.name for p in (tmp_path / "tensorboard").iterdir()) == ["1.00", "1.01", "1.02"]
    for subrun, (first, last) in {"1.00": (1, 25), "1.01": (21, 28), "1.02": (21, 30)}.items():
        run = read(tmp_path / "tensorboard" / subrun)
        loss = run.Scalars("train/loss")
        # Steps only go forward within a run: the steps 1.01 and 1.02 repeat are in runs of their own.
        assert [e.step for e in loss] == list(range(first, last + 1))
        assert [e.value for e in loss] == pytest.approx([LOSS[subrun] + s / 1000 for s in range(first, last + 1)])
        assert [e.wall_time for e in loss] == [1000.0 + s for s in range(first, last + 1)], "the trainer's time"
        expected = {"train/grad_norm": 1.0, "train/lr": 1e-3, "train/loss_scale": 1.0, "perf/step_time_s": 0.1,
                    "perf/tokens_per_s": 512 / 0.1}
        for tag, value in expected.items():
            assert [e.value for e in run.Scalars(tag)] == pytest.approx([value] * (last - first + 1)), tag
        assert "perf/mfu" not in run.Tags()["scalars"], "a measurement not made is not written as 0"


def test_incidents_and_decisions_are_text_at_their_steps(tmp_path):
    run_with_a_death_and_a_device_fault(tmp_path)
    first, second, third = (read(tmp_path / subrun) for subrun in ("1.00", "1.01", "1.02"))
    [(step, death)] = texts(first, INCIDENTS_TAG)
    assert step == 25 and "worker_death" in death and "decision: **restart**" in death  # after the last step seen
    [(step, fault)] = texts(second, INCIDENTS_TAG)
    assert step == 28 and "device_fault" in fault and "exclude_node" in fault
    assert f"{INCIDENTS_TAG}/text_summary" not in third.Tags()["tensors"], "1.02 met no incident"
    assert [step for step, _ in texts(first, SUBRUNS_TAG)] == [0, 25]
    (start_step, started), ended = texts(third, SUBRUNS_TAG)
    assert start_step == 20 and started.startswith("**1.02** started at step 20: ") and "device_fault" in started
    assert ended == (30, "**1.02** finished at step 30")


def test_the_launch_wires_it_in_when_enabled_and_closing_flushes_a_stopped_sub_run(tmp_path):
    initial = Launching("2.00", ResumePlan(subrun="2.00"), 0, "launch")
    config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "metrics.tensorboard.enabled=true"])
    with Logbook.open(tmp_path) as book:
        seen = build_observers(config, book, initial, io.StringIO(), None, None, None)
        assert seen.tensorboard in seen.all and seen.tensorboard.log_dir == tmp_path / "tensorboard"
        # A person stops the driver mid sub-run: no transition ends it, the driver's close flushes it.
        seen.tensorboard.on_transition(None, initial)
        seen.tensorboard.on_poll(Running("2.00", initial.plan, 0), GroupPoll(steps=[step_report(1, subrun="2.00")]))
        seen.close(None)
        assert [e.step for e in read(tmp_path / "tensorboard" / "2.00").Scalars("train/loss")] == [1]
        off = build_observers(load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none"]), book, initial,
                              io.StringIO(), None, None, None)
    assert off.tensorboard is None and not any(isinstance(o, TensorBoardObserver) for o in off.all)


def test_enabled_without_the_package_the_launch_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(metrics_config, "tensorboard_installed", lambda: False)
    with pytest.raises(ConfigError) as refused:
        load_run_config("demo", ["metrics.tensorboard.enabled=true"])
    message = str(refused.value)
    assert "\n" not in message and "pip install 'runmgr[tensorboard]'" in message
    assert "metrics.tensorboard.enabled=false" in message
    assert load_run_config("demo", []).metrics.tensorboard.enabled is False  # off by default: nothing needed


def test_the_folder_is_the_run_s_unless_the_config_names_one(tmp_path):
    default = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "metrics.tensorboard.enabled=true"])
    assert default.metrics.tensorboard.directory(default.run_dir()) == tmp_path / "run" / "tensorboard"
    named = load_run_config("demo", [f"metrics.tensorboard.dir={tmp_path / 'boards'}"])
    assert named.metrics.tensorboard.directory(named.run_dir()) == tmp_path / "boards"
