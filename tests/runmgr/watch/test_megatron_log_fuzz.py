"""Fuzz: 10,000 random and mutated Megatron lines through everything a live job's output goes
through: the reader and the output translator (runmgr/workers/megatron_output.py), the real
controller and judge (watcher and policy), and the logbook writer into a real logbook. No
exception escapes, and every step the logbook kept holds numbers that can be. Seeded and bounded:
no sleeping, an injected clock."""

from __future__ import annotations

import math
import random
from itertools import count

from logbook import Logbook
from runmgr.config.policy import InstabilityConfig, PolicyConfig, RestartConfig, RollbackConfig, Rung
from runmgr.controller.group import GroupPoll, WorkerInfo
from runmgr.observers.logbook_writer import LogbookObserver
from runmgr.watch.megatron_log import INT64_MAX, MegatronLogReader
from runmgr.workers.megatron_output import OutputTranslator
from tests.runmgr.controller.fakes import make_controller
from tests.runmgr.watch.absurd_lines import FIELD_CASES, FIELDS, LINE_CASES, iteration_line
from trainer.plan import ResumePlan

SEED = 20261128
LINES = 10_000
PER_POLL = 40
TOTAL = 5000
NUMBERS = ("0", "-0", "1", "-1", "nan", "NaN", "inf", "-inf", "+inf", "1e308", "1e400", "-1e400", "1e-400",
           str(2**63), str(2**63 - 1), str(-(2**63) - 1), str(10**40), "3.5", "-7.25", "0x1F", "1_000", "", " ",
           "abc", "١٢٣", "１２３", "12ab", "1e", ".", "-.5e-3", "∞", "\x00", "9" * 400)


def mutated(rng: random.Random, step: int) -> str:
    """A line a job could print: a valid iteration line with its numbers, separators or length
    broken, a case of the absurd table, a save/load/straggler line with random numbers, or noise."""
    roll = rng.random()
    if roll < 0.45:
        fields = {name.replace(" ", "_"): rng.choice(NUMBERS) for name in rng.sample(FIELDS, rng.randint(1, 4))}
        line = iteration_line(step, TOTAL, **fields).replace("elapsed time per iteration (ms)", "elapsed")
        line = line.replace(" elapsed:", " elapsed time per iteration (ms):")
        if rng.random() < 0.2:
            line = line.replace(f"iteration {step:8d}", f"iteration {rng.choice(NUMBERS)}")
        return _broken(rng, line)
    if roll < 0.6:
        return _broken(rng, rng.choice(FIELD_CASES).line(TOTAL))
    if roll < 0.7:
        return rng.choice(LINE_CASES).line(TOTAL)
    if roll < 0.85:
        number = rng.choice(NUMBERS + (str(step), str(rng.randrange(10**30))))
        return rng.choice([f"saving checkpoint at iteration {number} to /ck in torch_dist format",
                           f"  successfully saved checkpoint from iteration {number} to /ck [ t 1/1, p 1/1 ]",
                           f"  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration {number}",
                           f"| MnRtt/Rnk: {number}ms/{number} | MxRtt/Rnk: {number}ms/{rng.randrange(9)} |"])
    if roll < 0.95:
        return iteration_line(step, TOTAL)  # the job goes on as normal between the garbage
    return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(200)))


def _broken(rng: random.Random, line: str) -> str:
    roll = rng.random()
    if roll < 0.1:
        return line[:rng.randrange(len(line) + 1)]
    if roll < 0.2:
        return line.replace("|", rng.choice(["", "||", ":", " | x: |"]))
    if roll < 0.3:
        return line + line[line.index("|"):]  # every field twice
    return line


NEVER_GIVES_UP = PolicyConfig(
    restarts=RestartConfig(max_restarts=10**6, storm_restarts=10**6),
    rollback=RollbackConfig(from_scratch_within_steps=10**9),
    instability=InstabilityConfig(ladder=(Rung(action="rollback_skip", max_uses=10**6),)))
"""Budgets no fuzzed line can spend: every line is read, whatever the incidents."""


class FuzzGroup:
    """A worker group of two ranks whose poll is the next batch of fuzzed lines, read by the real
    translator as a Megatron job's output is."""

    def __init__(self, lines: list[str], clock: count) -> None:
        self.lines, self.clock = lines, clock
        self.translator: OutputTranslator | None = None

    def start(self, config, plan: ResumePlan) -> list[WorkerInfo]:
        self.translator = OutputTranslator(plan, (0, 1), MegatronLogReader(), None, seq_length=64)
        return [WorkerInfo(rank, 100 + rank, f"node{rank}", "127.0.0.1") for rank in (0, 1)]

    def poll(self, timeout_s: float) -> GroupPoll:
        poll = GroupPoll()
        batch, self.lines[:] = self.lines[:PER_POLL], self.lines[PER_POLL:]
        assert self.translator is not None
        self.translator.lines([(float(next(self.clock)), line) for line in batch], poll)
        if not self.lines:
            poll.finished_ranks = [0, 1]
        return poll

    def shutdown(self) -> None:
        pass


def test_ten_thousand_mutated_lines_never_crash_the_driver_and_the_logbook_keeps_only_what_can_be(tmp_path):
    rng = random.Random(SEED)
    lines = [mutated(rng, 1 + n // 3) for n in range(LINES)]
    clock = count(1_000_000)
    with Logbook.open(tmp_path) as book:
        controller, _ = make_controller([FuzzGroup(lines, clock) for _ in range(LINES)], policy=NEVER_GIVES_UP,
                                        observers=(LogbookObserver(book, {}),), train_iters=TOTAL)
        controller.clock = lambda: float(next(clock))
        controller.run()  # every line read, whatever the policy made of them, up to the job's end
        rows = book.all_metrics()
        events = book.events()
    assert not lines
    assert rows, "some valid steps are recorded"
    for row in rows:
        assert 0 < row["step"] <= INT64_MAX
        assert row["consumed_samples"] is None or 0 <= row["consumed_samples"] <= INT64_MAX
        for name in ("loss", "grad_norm"):
            assert row[name] is None or math.isnan(row[name]) or row[name] >= 0
        assert row["loss_scale"] is None or math.isnan(row["loss_scale"]) or 0 < row["loss_scale"] < math.inf
        assert row["lr"] is None or math.isnan(row["lr"]) or 0 <= row["lr"] < math.inf
        assert 0 <= row["step_time"] <= 86_400
    refused = [e for e in events if e["type"] == "event" and e["kind"] in ("refused_value", "refused_values")]
    assert refused and all(e["data"]["field"] for e in refused)
