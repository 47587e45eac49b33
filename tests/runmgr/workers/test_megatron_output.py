"""What a Megatron-style job's output means to the controller, line by line
(no processes): reports carry the plan's sub-run and the lines' arrival
times, a save's start is a checkpoint heartbeat of every rank, and a failed
node's text keeps torchrun's root cause but not its own traceback."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from runmgr.controller.group import GroupPoll, WorkerInfo
from runmgr.watch.megatron_log import MegatronLogReader
from runmgr.watch.observations import CheckpointObservation, SaveStarted
from runmgr.workers.megatron_output import OutputTranslator, node_failure
from runmgr.watch import torchrun
from trainer.plan import ResumePlan

PLAN = ResumePlan(subrun="7.02")
LINE = (" [2026-08-22 10:11:12.000000] iteration        5/     100 | consumed samples:           40 | "
        "elapsed time per iteration (ms): 100.0 | learning rate: 1.000000E-04 | global batch size:     8 | "
        "loss scale: 1.0 | number of skipped iterations:   1 | number of nan iterations:   0 |")


def test_a_step_is_reported_at_its_arrival_under_the_plans_sub_run_with_missing_values_as_nan():
    poll = GroupPoll()
    OutputTranslator(PLAN, [0, 1], MegatronLogReader(), None, seq_length=None).lines([(1000.0, LINE)], poll)
    [step] = poll.steps
    assert (step.subrun, step.step, step.time, step.consumed_samples, step.tokens) == ("7.02", 5, 1000.0, 40, 0)
    assert math.isnan(step.loss) and math.isnan(step.grad_norm) and step.skipped
    assert [(o.subrun, o.time) for o in poll.observations] == [("7.02", 1000.0)]
    assert {(b.rank, b.phase, b.step, b.time) for b in poll.heartbeats} == {(0, "step", 5, 1000.0),
                                                                            (1, "step", 5, 1000.0)}


SAVED = "  successfully saved checkpoint from iteration       4 to /save [ t 1/1, p 1/1 ]"


def test_two_ranks_messages_torn_into_one_line_are_each_reported():
    """Unbuffered, ``print`` writes its text and its newline apart: rank 0's save line and the last
    rank's iteration line printed at once arrive as one line and an empty one (seen beside busy loops)."""
    for torn in (SAVED + LINE, LINE + SAVED):
        poll = GroupPoll()
        OutputTranslator(PLAN, [0, 1], MegatronLogReader(), Path("/save"), seq_length=None).lines(
            [(1000.0, torn), (1000.5, "")], poll)
        assert [step.step for step in poll.steps] == [5], torn
        assert [(c.step, c.path) for c in poll.checkpoints] == [(4, "/save/iter_0000004")], torn
        assert not [o for o in poll.observations if type(o).__name__ == "RefusedValue"], torn


class SavingReader:
    def parse(self, line: str, received_at: Optional[float] = None):
        if line.startswith("saving"):
            return SaveStarted(step=4, time=received_at, subrun="00")
        return CheckpointObservation(step=4, time=received_at, consumed_samples=32, subrun="00")

    def parse_all(self, line: str, received_at: Optional[float] = None) -> list:
        return [self.parse(line, received_at)]

    def take_refused(self) -> list:
        return []


def test_a_save_beats_checkpoint_on_every_rank_then_step_once_saved_and_its_report_times_it(tmp_path: Path):
    (tmp_path / "step_00000004").mkdir()  # the built-in trainer's layout wins when it is there
    poll = GroupPoll()
    translator = OutputTranslator(PLAN, [0, 1, 2], SavingReader(), tmp_path, seq_length=16)
    translator.lines([(10.0, "saving ..."), (13.5, "successfully saved ...")], poll)
    # Saved, the ranks are back to stepping: a silence after the save is judged by a step's timeout.
    assert [(b.rank, b.phase, b.step, b.time) for b in poll.heartbeats] == [
        *((r, "checkpoint", 4, 10.0) for r in (0, 1, 2)), *((r, "step", 4, 13.5) for r in (0, 1, 2))]
    [report] = poll.checkpoints
    assert (report.path, report.seconds, report.subrun) == (str(tmp_path / "step_00000004"), 3.5, "7.02")


TORCHRUN_REPORT = """\
rank 0 prints this last
E0822 10:11:12.000000 123 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 3) local_rank: 0
Traceback (most recent call last):
  File "/venv/lib/python3.12/site-packages/torch/distributed/run.py", line 922, in <module>
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pretrain_gpt.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-08-22_10:11:12
  host      : node-a
  rank      : 2 (local_rank: 0)
  exitcode  : 3 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def test_a_failed_node_blames_the_root_cause_rank_and_keeps_its_block_without_torchruns_traceback():
    worker = WorkerInfo(2, 4242, "n1", "10.0.0.2")
    failure = node_failure([2, 3], 1, TORCHRUN_REPORT.splitlines(), [], torchrun,
                           lambda rank: worker if rank == 2 else None, 5.0)
    assert (failure.rank, failure.worker, failure.kind, failure.time) == (2, worker, "error", 5.0)
    lines = failure.text.splitlines()
    assert lines[0] == "rank 2 exited with code 3"
    assert "  exitcode  : 3 (pid: 4242)" in lines and "rank 0 prints this last" in lines
    assert not any("raise ChildFailedError" in line for line in lines)


def test_a_node_without_torchruns_report_blames_its_first_rank_with_torchruns_own_code():
    failure = node_failure([4, 5], -9, ["Killed"], [], torchrun, lambda rank: None, 1.0)
    assert (failure.rank, failure.text) == (4, "rank 4 exited with code -9\nKilled")


def test_a_sub_run_starts_at_its_checkpoint_with_its_planned_silences_and_a_load_beats_init():
    from runmgr.watch.silences import PlannedSilences

    silences = PlannedSilences("7.02", 5.0, skipped=(41, 42))
    translator = OutputTranslator(PLAN, [0, 1], MegatronLogReader(), None, seq_length=None, start_step=40,
                                  silences=silences)
    poll = GroupPoll()
    translator.started(poll, 5.0)
    assert poll.observations == [silences]
    assert {(b.rank, b.phase, b.step) for b in poll.heartbeats} == {(0, "init", 40), (1, "init", 40)}
    loaded = GroupPoll()
    translator.lines([(9.0, "  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration 40")], loaded)
    assert {(b.rank, b.phase, b.step, b.time) for b in loaded.heartbeats} == {(0, "init", 40, 9.0),
                                                                              (1, "init", 40, 9.0)}


def test_a_rank_that_finished_is_not_beaten_by_another_node_s_lines():
    translator = OutputTranslator(PLAN, [0, 1], MegatronLogReader(), None, seq_length=None)
    translator.finished([1])  # node 1 (rank 1) exited 0 after the last iteration
    poll = GroupPoll()
    translator.lines([(1000.0, LINE)], poll)
    assert [b.rank for b in poll.heartbeats] == [0]


def test_a_failed_node_keeps_its_exit_code_and_its_own_last_lines():
    job = ["usage: pretrain_gpt.py [-h]", "pretrain_gpt.py: error: unrecognized arguments: --bogus-flag"]
    root_cause = ["=" * 60, "pretrain_gpt.py FAILED", "-" * 60, "Failures:", "  <NO_OTHER_FAILURES>", "-" * 60,
                  "Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-28_06:44:15",
                  "  host      : box", "  rank      : 0 (local_rank: 0)", "  exitcode  : 2 (pid: 7635)",
                  "  error_file: <N/A>", "  traceback : To enable traceback see: https://pytorch.org/docs/stable/"
                  "elastic/errors.html", "=" * 60]
    failure = node_failure([0], 1, [*job, *root_cause], [], torchrun, lambda rank: None, 3.0)
    assert failure.exit_code == 2  # the rank's own code (argparse's), not torchrun's 1
    assert failure.output == tuple(job)  # the job's lines, without torchrun's report
