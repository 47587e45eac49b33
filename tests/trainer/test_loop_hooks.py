"""The training loop and its recovery hooks (trainer/recovery/hooks.py), in this process:
one rank, with a fake recovery that records every hook call among the reports, in order,
and can fail a step, resume the session at a step it kept, decline, or fail itself."""

from __future__ import annotations

import copy
from typing import Optional

import pytest
import torch.distributed as dist

from tests.trainer.test_loop import ListReporter, one_rank_config, restore_torch_globals  # noqa: F401 (fixture)
from trainer import DistEnv, NullReporter, ResumePlan, train
from trainer.recovery import NoRecovery, recovery_for
from trainer.recovery.state import capture, restore
from trainer.session import Session


class Log(ListReporter):
    """The reports, and the hook calls among them, as one list of events in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []

    def step(self, report) -> None:
        super().step(report)
        self.events.append(("report", report.step))

    def heartbeat(self, beat) -> None:
        super().heartbeat(beat)
        if beat.phase in ("step", "checkpoint"):
            self.events.append((beat.phase, beat.step))


class FakeRecovery:
    """Records the hook calls in ``log``. ``fail_at``: after_step raises this error at that
    step, once; ``resume``: on_failure puts back its copy of the step before and resumes there
    (False: it declines); ``broken``: on_failure raises it."""

    keeps_reports = False

    def __init__(self, log: Log, fail_at: Optional[tuple[int, BaseException]] = None, resume: bool = True,
                 broken: Optional[BaseException] = None) -> None:
        self.log, self.fail_at, self.resume, self.broken = log, fail_at, resume, broken
        self.kept: dict[int, dict] = {}
        self.errors: list[BaseException] = []

    def on_start(self, session: Session) -> None:
        self.log.events.append(("on_start", session.ctx.start_step))
        self.kept[session.ctx.start_step] = copy.deepcopy(capture(session))

    def on_commit(self, session: Session, step: int, report) -> None:
        self.log.events.append(("on_commit", step, report is not None))

    def after_step(self, session: Session, step: int) -> None:
        self.log.events.append(("after_step", step))
        self.kept[step] = copy.deepcopy(capture(session))
        if self.fail_at is not None and self.fail_at[0] == step:
            error, self.fail_at = self.fail_at[1], None
            raise error

    def on_failure(self, session: Session, error: RuntimeError) -> Optional[int]:
        self.log.events.append(("on_failure", str(error)))
        self.errors.append(error)
        if self.broken is not None:
            raise self.broken
        if not self.resume:
            return None
        step = max(self.kept) - 1  # the failed step's own copy is given up: as if it never finished
        restore(session, copy.deepcopy(self.kept[step]))
        return step


def fake(recovery: FakeRecovery):
    """The factory ``train`` calls once its process groups have started."""
    return lambda config, device, dist_env: recovery


def test_the_loop_calls_the_hooks_in_order_and_a_recovery_that_does_nothing_changes_nothing(
        tmp_path, restore_torch_globals):
    sections = {"training": {"train_iters": 4, "log_interval": 2},  # saves at 3 and 4, each committed at once
                "checkpoint": {"async_save": False}}
    config = one_rank_config(tmp_path / "fake", **sections)
    log = Log()
    result = train(config, ResumePlan(skip_iterations=(2,)), log, DistEnv(), recovery=fake(FakeRecovery(log)))
    assert log.events == [
        ("on_start", 0),
        ("step", 1), ("on_commit", 1, False), ("after_step", 1),
        ("step", 2), ("on_commit", 2, False), ("after_step", 2),  # a dummy iteration: committed at once
        ("step", 3), ("on_commit", 3, False), ("checkpoint", 3), ("after_step", 3),
        # A step's commit comes before its report and its checkpoint phase.
        ("step", 4), ("on_commit", 4, True), ("report", 4), ("checkpoint", 4), ("after_step", 4),
        ("checkpoint", 4),  # the end: nothing left in flight to commit
    ]
    plain = train(one_rank_config(tmp_path / "plain", **sections), ResumePlan(skip_iterations=(2,)), NullReporter(),
                  DistEnv())
    assert result.losses == plain.losses and result.consumed_samples == plain.consumed_samples


def test_a_failure_the_recovery_survives_resumes_the_loop_after_the_step_it_names(tmp_path, restore_torch_globals):
    config = one_rank_config(tmp_path / "fake", training={"train_iters": 4})
    log = Log()
    recovery = FakeRecovery(log, fail_at=(2, RuntimeError("peer gone")))
    result = train(config, ResumePlan(), log, DistEnv(), recovery=fake(recovery))
    steps = [event for event in log.events if event[0] in ("on_failure", "on_commit")]
    assert steps == [("on_commit", 1, True), ("on_commit", 2, True), ("on_failure", "peer gone"),
                     ("on_commit", 2, True), ("on_commit", 3, True), ("on_commit", 4, True)]
    assert [report.step for report in log.steps] == [1, 2, 2, 3, 4]  # step 2 ran again
    plain = train(one_rank_config(tmp_path / "plain", training={"train_iters": 4}), ResumePlan(), NullReporter(),
                  DistEnv())
    assert result.losses == plain.losses  # the session was put back whole: bit for bit
    assert result.consumed_samples == plain.consumed_samples


def test_a_failure_the_recovery_declines_goes_on_to_the_caller(tmp_path, restore_torch_globals):
    log = Log()
    error = RuntimeError("not a peer's death")
    recovery = FakeRecovery(log, fail_at=(2, error), resume=False)
    with pytest.raises(RuntimeError, match="not a peer's death") as raised:
        train(one_rank_config(tmp_path, training={"train_iters": 4}), ResumePlan(), log, DistEnv(),
              recovery=fake(recovery))
    assert raised.value is error and recovery.errors == [error]
    assert log.events[-2:] == [("after_step", 2), ("on_failure", "not a peer's death")]
    assert not dist.is_initialized()  # the process group was torn down


def test_a_recovery_that_fails_fails_the_run(tmp_path, restore_torch_globals):
    log = Log()
    recovery = FakeRecovery(log, fail_at=(1, RuntimeError("peer gone")), broken=ValueError("cannot re-form"))
    with pytest.raises(ValueError, match="cannot re-form"):
        train(one_rank_config(tmp_path, training={"train_iters": 4}), ResumePlan(), log, DistEnv(),
              recovery=fake(recovery))
    assert log.events[-1] == ("on_failure", "peer gone")
    assert not dist.is_initialized()


def test_only_a_runtime_error_goes_to_the_recovery(tmp_path, restore_torch_globals):
    """Anything else (a full disk, a stop at a beat that is no RuntimeError) is no peer's death."""
    log = Log()
    recovery = FakeRecovery(log, fail_at=(2, OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        train(one_rank_config(tmp_path, training={"train_iters": 4}), ResumePlan(), log, DistEnv(),
              recovery=fake(recovery))
    assert recovery.errors == [] and log.events[-1] == ("after_step", 2)
    assert not dist.is_initialized()


class Link:
    buddy_offset = 1


def test_train_recovers_nothing_unless_warm_with_snapshots(tmp_path):
    """No warm link, or no ``checkpoint.memory_interval``: the default, which survives nothing."""
    config = one_rank_config(tmp_path)
    assert isinstance(recovery_for(None)(config, None, DistEnv()), NoRecovery)
    assert isinstance(recovery_for(Link())(config, None, DistEnv()), NoRecovery)
    assert NoRecovery().on_failure(None, RuntimeError("Connection reset by peer")) is None


def test_a_warm_link_and_a_recovery_of_ones_own_are_refused_together(tmp_path):
    with pytest.raises(TypeError, match="warm or recovery"):
        train(one_rank_config(tmp_path), ResumePlan(), NullReporter(), DistEnv(), Link(),
              recovery=fake(FakeRecovery(Log())))
