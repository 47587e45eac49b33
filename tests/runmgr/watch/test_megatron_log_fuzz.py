"""Fuzz: 10,000 random and mutated Megatron lines through everything a live job's output goes
through: the reader and the output translator (runmgr/workers/megatron_output.py), a real judge
with the default watcher and policy, and the logbook writer into a real logbook; then the same
kind of lines through the real controller, sub-run after sub-run. No exception escapes, every
step the logbook kept holds numbers that can be, and the refusals it recorded are bounded and
add up. Seeded and bounded: no sleeping, an injected clock."""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import count

from logbook import Logbook
from runmgr.config.policy import InstabilityConfig, PolicyConfig, RestartConfig, RollbackConfig, Rung
from runmgr.config.watcher import WatcherConfig
from runmgr.controller.group import GroupPoll, WorkerInfo
from runmgr.controller.judge import Judge
from runmgr.controller.states import Finished, Launching, Running
from runmgr.observers.logbook_writer import REFUSALS_PER_FIELD, LogbookObserver
from runmgr.watch.megatron_log import INT64_MAX, MAX_ITERATION_S, MegatronLogReader
from runmgr.watch.observations import RefusedValue, StepObservation
from runmgr.workers.megatron_output import OutputTranslator
from tests.runmgr.controller.fakes import make_controller
from tests.runmgr.watch.absurd_lines import FIELD_CASES, FIELDS, LINE_CASES, iteration_line
from trainer.plan import ResumePlan

SEED = 20261128
LINES = 10_000
CONTROLLER_LINES = 2_000
PER_POLL = 40
TOTAL = 5000
NUMBERS = ("0", "-0", "1", "-1", "nan", "NaN", "-nan", "inf", "-inf", "+inf", "INF", "1e308", "1e400", "-1e400",
           "1e-400", str(2**63), str(2**63 - 1), str(-(2**63) - 1), str(10**40), "3.5", "-7.25", "0x1F", "1_000",
           "", " ", "abc", "information", "nano", "١٢٣", "１２３", "12ab", "1e", ".", "1.2.3", "-.5e-3", "∞", "\x00",
           "\x1b[2J", "9" * 400, "9" * 5000, "1e" + "9" * 500, "0" * 30 + "7", "6049.0/6100.2", "4.0/abc")
JUMPS = (f"iteration {2**62}/ {2**63 - 1}", f"iteration {2**63 - 1}/ 0", "iteration 1/ 1", f"iteration {TOTAL}/ 0")
NOISE = (
    "NVRM: Xid (PCI:0000:01:00): {n}, pid=1, name=python",
    "[rank{n}]: [E ProcessGroupNCCL.cpp] NCCL watchdog thread terminated: ncclRemoteError",
    "RuntimeError: Rank {n}, node h, device 0, iteration {n}: Unexpected result nan (message='found NaN')",
    " validation loss at iteration {n} | lm loss value: {n} | lm loss PPL: {n} |",
    "Root Cause (first observed failure):\n  rank      : {n} (local_rank: {n})\n  exitcode  : {n} (pid: {n})",
)


def mutated(rng: random.Random, step: int) -> str:
    """A line a job could print: a valid iteration line with its numbers, separators or length
    broken, a case of the absurd table, a save/load/straggler line with random numbers, a death
    or torchrun line with random numbers, or noise."""
    roll = rng.random()
    if roll < 0.45:
        fields = {name.replace(" ", "_"): rng.choice(NUMBERS) for name in rng.sample(FIELDS, rng.randint(1, 4))}
        line = iteration_line(step, TOTAL, **fields).replace("elapsed time per iteration (ms)", "elapsed")
        line = line.replace(" elapsed:", " elapsed time per iteration (ms):")
        if rng.random() < 0.2:
            line = line.replace(f"iteration {step:8d}", f"iteration {rng.choice(NUMBERS)}")
        if rng.random() < 0.1:
            line = line.replace(f"/{TOTAL:8d}", f"/{rng.choice(NUMBERS)}")
        if rng.random() < 0.05:  # a jump as far as its own total allows (2^62 iterations in one line)
            line = line.replace(f"iteration {step:8d}/{TOTAL:8d}", rng.choice(JUMPS))
        return _broken(rng, line)
    if roll < 0.55:
        return _broken(rng, rng.choice(FIELD_CASES).line(TOTAL))
    if roll < 0.62:
        return rng.choice(LINE_CASES).line(TOTAL)
    if roll < 0.77:
        number = lambda: rng.choice(NUMBERS + (str(step), str(rng.randrange(10**30))))  # noqa: E731
        return rng.choice([f"saving checkpoint at iteration {number()} to /ck in torch_dist format",
                           f"  successfully saved checkpoint from iteration {number()} to /ck [ t 1/1, p 1/1 ]",
                           f"  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration {number()}",
                           f"| MnRtt/Rnk: {number()}ms/{number()} | MxRtt/Rnk: {number()}ms/{number()} |"])
    if roll < 0.82:
        return rng.choice(NOISE).format(n=rng.choice(NUMBERS))
    if roll < 0.95:
        return iteration_line(step, TOTAL)  # the job goes on as normal between the garbage
    return "".join(chr(rng.randrange(0x0, 0x2FFF)) for _ in range(rng.randrange(200)))


def _broken(rng: random.Random, line: str) -> str:
    roll = rng.random()
    if roll < 0.1:
        return line[:rng.randrange(len(line) + 1)]
    if roll < 0.2:
        return line.replace("|", rng.choice(["", "||", ":", " | x: |"]))
    if roll < 0.3:
        return line + line[line.index("|"):]  # every field twice
    if roll < 0.35:
        at = rng.randrange(len(line) + 1)
        return line[:at] + rng.choice(["é", "\u200b", "\ufeff", "𝟗", "\u202e", "\x00", "\r"]) + line[at:]
    return line


def fuzzed_lines(count_: int, seed: int = SEED) -> list[str]:
    """``count_`` lines, three per iteration on average (seeded)."""
    rng = random.Random(seed)
    return [mutated(rng, 1 + n // 3) for n in range(count_)]


def assert_every_kept_step_can_be(rows: list[dict]) -> None:
    """What the logbook kept of each step: numbers that can be, or none (unknown)."""
    assert rows, "some valid steps are recorded"
    for row in rows:
        assert 0 < row["step"] <= INT64_MAX
        assert row["consumed_samples"] is None or 0 <= row["consumed_samples"] <= INT64_MAX
        assert row["tokens"] is None or 0 <= row["tokens"] <= INT64_MAX
        for name in ("loss", "grad_norm"):  # NaN and infinity are signals, kept
            assert row[name] is None or math.isnan(row[name]) or row[name] >= 0
        assert row["loss_scale"] is None or math.isnan(row["loss_scale"]) or 0 < row["loss_scale"] < math.inf
        assert row["lr"] is None or math.isnan(row["lr"]) or 0 <= row["lr"] < math.inf
        assert 0 <= row["step_time"] <= MAX_ITERATION_S


def refusal_events(events: list[dict]) -> tuple[Counter, Counter]:
    """The ``refused_value`` events by (sub-run, field), and the ``refused_values`` counts."""
    one_by_one, counted = Counter(), Counter()
    for event in events:
        if event["type"] == "event" and event["kind"] == "refused_value":
            one_by_one[event["subrun"], event["data"]["field"]] += 1
        elif event["type"] == "event" and event["kind"] == "refused_values":
            counted[event["subrun"], event["data"]["field"]] = event["data"]["count"]
    return one_by_one, counted


def test_ten_thousand_mutated_lines_through_the_translator_a_default_judge_and_the_logbook(tmp_path):
    lines = fuzzed_lines(LINES)
    clock = count(1_000_000)
    plan = ResumePlan(subrun="1.00", data_parallel_size=2)
    workers = [WorkerInfo(rank, 100 + rank, f"node{rank}", "127.0.0.1") for rank in (0, 1)]
    translator = OutputTranslator(plan, (0, 1), MegatronLogReader(), None, seq_length=64)
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda max_step: [])
    judge.start_subrun(workers, final_step=TOTAL)
    running = Running("1.00", plan, 0, tuple(workers))
    refused: Counter = Counter()
    steps: set[int] = set()
    last_step = 0
    with Logbook.open(tmp_path, clock=lambda: 2000.0) as book:
        writer = LogbookObserver(book, {})
        writer.on_transition(None, Launching("1.00", plan, 0, "launch"))
        writer.on_transition(None, running)
        for start in range(0, LINES, PER_POLL):
            poll = GroupPoll()
            translator.lines([(float(next(clock)), line) for line in lines[start:start + PER_POLL]], poll)
            refused.update(o.field for o in poll.observations if isinstance(o, RefusedValue))
            steps.update(o.step for o in poll.observations if isinstance(o, StepObservation))
            last_step = max([last_step, *(report.step for report in poll.steps)])
            writer.on_poll(running, poll)
            for judgement in judge.judge("1.00", poll, (), float(next(clock)), last_step):
                writer.on_judgement(running, judgement)
        writer.on_transition(running, Finished("1.00", last_step))
        rows, events = book.all_metrics(), book.events()
    assert_every_kept_step_can_be(rows)
    assert {row["step"] for row in rows} == steps  # every step the reader believed, and only those
    one_by_one, counted = refusal_events(events)
    every_field = {*FIELDS, "iteration", "saving iteration", "saved iteration", "loaded iteration", "straggler report",
                   "elapsed time per iteration"}  # (a key whose unit was mangled)
    assert set(refused) == {name for _, name in one_by_one} == every_field  # every field, named
    for name, seen in refused.items():  # the first few one by one, then a count: bounded, and adding up
        assert one_by_one["1.00", name] == min(seen, REFUSALS_PER_FIELD)
        assert counted.get(("1.00", name), seen) == seen
    assert sum(one_by_one.values()) <= REFUSALS_PER_FIELD * len(refused) < sum(refused.values()) / 10


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


def test_mutated_lines_through_the_controller_sub_run_after_sub_run_never_crash_the_driver(tmp_path):
    lines = fuzzed_lines(CONTROLLER_LINES, seed=SEED + 1)
    clock = count(1_000_000)
    with Logbook.open(tmp_path) as book:
        controller, _ = make_controller([FuzzGroup(lines, clock) for _ in range(CONTROLLER_LINES)],
                                        policy=NEVER_GIVES_UP, observers=(LogbookObserver(book, {}),),
                                        train_iters=TOTAL)
        controller.clock = lambda: float(next(clock))
        controller.run()  # every line read, whatever the policy made of them, up to the job's end
        rows, events, lineage = book.all_metrics(), book.events(), book.lineage()
    assert not lines
    assert_every_kept_step_can_be(rows)
    assert len(lineage) > 1 and all(not subrun.is_open for subrun in lineage)  # every sub-run closed
    one_by_one, _ = refusal_events(events)
    assert one_by_one and max(one_by_one.values()) <= REFUSALS_PER_FIELD
