"""Megatron-LM / MindSpeed-LLM training logs as observations.

The iteration line is ``iteration N/ M |`` followed by ``key: value |``
fields whose set varies by version and fork, e.g.::

     [2024-09-03 16:02:57] iteration       50/  500000 | consumed samples:        51200 |
     elapsed time per iteration (ms): 12056.1 | learning rate: 4.744186E-06 | global batch size:  1024 |
     lm loss: 8.219823E+00 | loss scale: 131072.0 | grad norm: 35.929 | number of skipped iterations:   1 |
     number of nan iterations:   0 |

Variants handled: no timestamp (older Megatron; the time then accumulates
from the elapsed time per iteration), ``[YYYY-MM-DD HH:MM:SS(.ffffff)]`` and
ISO stamps with a zone, a ``current time: <unix>`` field, ``(s)`` instead of
``(ms)``, ``avg/max`` pairs (``13372.8/13364.7``), a rank prefix from srun
(``1: iteration ...``). Megatron omits ``lm loss`` when it is NaN or when every
iteration of the interval was an overflow skip, and ``grad norm`` on skipped
steps: those come through as None. Values are averages over the log interval,
so one line covers ``iterations`` steps. ``successfully saved checkpoint at|from
iteration N`` lines give the checkpoints, ``saving checkpoint at iteration N``
the start of a save, ``successfully loaded checkpoint from DIR ... at iteration
N`` the resume; ``--log-straggler``'s report (``| MnRtt/Rnk: 1052.20ms/3 |
MxRtt/Rnk: 1400.50ms/7 | ...``, megatron/core/utils.py) the fastest and slowest
ranks' iteration times. An iteration number going back marks a restart (a new
sub-run); lines carrying a worker-death signature (NCCL/HCCL errors, Xids,
UCE, the rerun machine's exits...) become worker exits.

One reader serves ``runmgr watch replay`` (each line's time is its stamp) and a
live Megatron job (``received_at``: when the line arrived; ``subrun``: the
sub-run the job is).

A job may print anything, so every number is checked before it is believed
(:class:`~runmgr.watch.observations.RefusedValue` says what was left out, and
why; nothing here raises on what a line holds):

- a value is a number only when it is one in full (``nan`` and ``inf`` included;
  for Megatron's ``avg/max`` pairs, the first): ``12ab``, ``0x1F``, ``1_000``,
  ``1.2.3`` or ``information`` are not numbers, not 12, 0, 1, 1.2 or infinity;
- the iteration must be a whole number from 1 to its line's own total (when the
  total is above 0) and below 2^63, the total a whole number below 2^63;
  otherwise the whole line is refused (``iteration nan/ 30 |``,
  ``iteration -5/ 30 |`` included), as are save, load and straggler lines whose
  iteration is not a whole number from 0 below 2^63, whose times are not
  finite, not negative and at most a day, or whose ranks are not from 0 below
  2^31 (a step beyond 2^63 - 1 cannot even be stored);
- consumed samples and the skipped and NaN iteration counts must be whole numbers
  from 0, the global batch from 1, all below 2^63 (the counts at most the
  iterations the line covers, or its iteration for the first line);
- the LM loss and the grad norm may be NaN or +infinity (that is what the
  non-finite detector is for; ``1e400`` is infinity) but not negative; the loss
  scale must be finite and above 0; the learning rate, the throughput and the
  elapsed time per iteration finite and not negative, the time at most a day
  and its key saying its unit, ``(ms)`` or ``(s)``;
- a refused field is left out (None; the skipped and NaN counts 0), the step
  stays; nothing is clamped into range or made up;
- a refusal names its field (the variants of the elapsed-time and throughput
  keys under one name each, so that they are few), its text and its line, cut
  short, with control characters written as ``\\xNN``.

:meth:`MegatronLogReader.take_refused` hands over what a line had refused;
:meth:`MegatronLogReader.events` yields them after the line's observation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Optional, Union

from runmgr.watch.deaths import classify
from runmgr.watch.observations import (
    CheckpointObservation, LoadedCheckpoint, RankTimings, RefusedValue, SaveStarted, StepObservation, WorkerExit,
)
from runmgr.watch.text import printable

LogEvent = Union[StepObservation, CheckpointObservation, WorkerExit, RankTimings, SaveStarted, LoadedCheckpoint,
                 RefusedValue]

INT64_MAX = 2**63 - 1
"""The largest whole number a step, a sample count or a batch can be (SQLite's INTEGER)."""
INT64_DIGITS = 19
"""Digits of INT64_MAX: a whole number written with more is past it (and Python refuses ``int()``
of a few thousand digits, which a job may print)."""
MAX_ITERATION_S = 86_400.0
"""An iteration (or a straggler's mean iteration) longer than a day is not a time the job measured."""
MAX_RANK = 2**31 - 1
ELAPSED = "elapsed time per iteration"
TOKENS_PER_S = "tokens per second"
"""The name a refused throughput goes by, whichever key (``tokens/sec/gpu``, ``tokens per sec``...) held it."""
RAW_CHARS, LINE_CHARS = 100, 300

_ITERATION = re.compile(r"\biteration\s+([^\s/|]+)\s*/\s*([^\s|]*)\s*\|(.*)$")
"""Megatron's iteration line, its iteration and total as printed (checked as whole numbers after)."""
_STAMP = re.compile(r"\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\]")
_TOKEN = r"([^\s|\[\],]+)"
_SAVED = re.compile(r"successfully saved checkpoint (?:at|from) iteration\s+" + _TOKEN)
_SAVING = re.compile(r"saving checkpoint at iteration\s+" + _TOKEN + " to ")
_LOADED = re.compile(r"successfully loaded checkpoint from (\S+).*?\bat iteration\s+" + _TOKEN)
_STRAGGLER = re.compile(r"MnRtt/Rnk:\s*([^\s|/]+?)ms/([^\s|]+)\s*\|\s*MxRtt/Rnk:\s*([^\s|/]+?)ms/([^\s|]+)")
_RANK = re.compile(r"\[[Rr]ank\s*(\d{1,9})\]|\[rank(\d{1,9})\]:")
_NUMBER_TEXT = r"[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
_VALUE = re.compile(rf"\s*({_NUMBER_TEXT})(?:\s*/\s*{_NUMBER_TEXT})?\s*", re.IGNORECASE)
"""A value in full: one number, or Megatron's ``avg/max`` pair (the first is the value)."""
_WHOLE = re.compile(r"[-+]?\d+")
_MESSAGE_START = re.compile(r"(?:" + _STAMP.pattern + r"\s*)?\biteration\s+[^\s/|]+\s*/\s*[^\s|]*\s*\|"
                            r"|saving checkpoint at iteration\b|successfully (?:saved|loaded) checkpoint\b")
"""Where one of Megatron's messages (an iteration line, its stamp first; a save or load line) starts."""


def messages(line: str) -> list[str]:
    """The messages one line holds, each whole: usually the line itself. Ranks of one node print
    into one pipe, and an unbuffered Python's ``print`` writes its text and its newline in two
    calls, so rank 0's save line and the last rank's iteration line can arrive as one line
    (``A`` ``B`` ``\\n`` ``\\n``; seen beside busy loops). Such a line is cut where each message
    starts; a write (below the pipe's 4 KiB) is never cut inside, so each piece is one rank's message."""
    starts = [found.start() for found in _MESSAGE_START.finditer(line)]
    if len(starts) < 2:
        return [line]
    cuts = [0, *starts[1:], len(line)]
    return [line[start:end] for start, end in zip(cuts, cuts[1:])]


def parse_fields(rest: str) -> dict[str, str]:
    """``key: value | key: value |`` into a dict (keys lower-cased, values raw)."""
    fields = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(": ")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def number(text: Optional[str]) -> Optional[float]:
    """The number ``text`` is in full (``nan``/``inf`` included; of an ``avg/max`` pair, the
    first); None when it is not one (``12ab``, ``0x1F``, ``abc``, nothing)."""
    token = _number_token(text)
    return float(token) if token is not None else None


def whole_number(text: Optional[str]) -> Optional[Union[int, float]]:
    """The number ``text`` is, exact when it is written as a whole number (a float's 53 bits
    would round a large count); None when it is not one."""
    token = _number_token(text)
    if token is None:
        return None
    return exact_int(token) if _WHOLE.fullmatch(token) else float(token)


def exact_int(token: str) -> int:
    """A whole number's digits (maybe signed) as an int; with more than INT64_DIGITS significant
    digits, one past the int64 range on its side instead (no count can be that large, and
    ``int()`` refuses thousands of digits)."""
    digits = token.lstrip("+-").lstrip("0")
    if len(digits) > INT64_DIGITS:
        return -INT64_MAX - 2 if token.startswith("-") else INT64_MAX + 1
    return int(token)


def _number_token(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    match = _VALUE.fullmatch(text)
    return match.group(1) if match else None


def whole_problem(value: Optional[Union[int, float]], minimum: int, maximum: int = INT64_MAX) -> Optional[str]:
    """Why ``value`` cannot be a count from ``minimum`` to ``maximum`` (None: it can)."""
    if value is None:
        return "not a number"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "not finite"
        if value != math.floor(value):
            return "not a whole number"
    if value < minimum:
        return f"below {minimum}"
    if value > maximum:
        return "past 2^63 - 1" if maximum == INT64_MAX else f"above {maximum}"
    return None


def real_problem(value: Optional[float], lowest: float = 0.0, above_lowest: bool = False,
                 nonfinite_ok: bool = False, highest: float = math.inf) -> Optional[str]:
    """Why ``value`` cannot be such a measurement (None: it can). NaN and infinities pass
    only with ``nonfinite_ok`` (a loss or a grad norm that really blew up)."""
    if value is None:
        return "not a number"
    if not math.isfinite(value):
        return None if nonfinite_ok and (math.isnan(value) or value > 0) else "not finite"
    if value < lowest or (above_lowest and value == lowest):
        return f"{'not above' if above_lowest else 'below'} {lowest:g}"
    if value > highest:
        return f"above {highest:g}"
    return None


def stamp_seconds(line: str) -> Optional[float]:
    """Unix seconds of a ``[2024-09-03 16:02:57]``-style stamp (naive stamps read as UTC)."""
    match = _STAMP.search(line)
    if not match:
        return None
    try:
        moment = datetime.fromisoformat(match.group(1).replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


class MegatronLogReader:
    """Turns log lines into observations, keeping what spans lines (time, sub-run).

    ``subrun``: the id every observation carries (a live sub-run's); None numbers the
    log's own restarts ``00``, ``01``, ... (a replay)."""

    def __init__(self, subrun: Optional[str] = None) -> None:
        self._previous: Optional[StepObservation] = None
        self._subrun_index = 0
        self._subrun_id = subrun
        self._consumed_at: dict[int, Optional[int]] = {}
        self._received_at: Optional[float] = None
        self._refused: list[RefusedValue] = []

    def events(self, lines: Iterable[str]) -> Iterator[LogEvent]:
        """Every observation the lines hold, in order (a line's refused values after it)."""
        for line in lines:
            yield from self.parse_all(line)
            yield from self.take_refused()

    def take_refused(self) -> list[RefusedValue]:
        """The values refused since the last call (the lines parsed since)."""
        refused, self._refused = self._refused, []
        return refused

    def parse_all(self, line: str, received_at: Optional[float] = None) -> list[LogEvent]:
        """Every observation ``line`` holds, in order: one per message (:func:`messages`)."""
        events = [self.parse(message, received_at) for message in messages(line)]
        return [event for event in events if event is not None]

    def parse(self, line: str, received_at: Optional[float] = None) -> Optional[LogEvent]:
        """The observation one line holds, if any. ``received_at`` (a live job: when the line
        arrived) is the observation's time; without it, the line's own stamp or the log's clock.
        What the line holds that cannot be is refused (:meth:`take_refused`)."""
        self._received_at = received_at
        match = _ITERATION.search(line)
        if match:
            return self._checked_iteration(line, match)
        saved = _SAVED.search(line)
        if saved:
            step = self._line_step(saved.group(1), "saved iteration", line)
            if step is None:
                return None
            return CheckpointObservation(step=step, time=self._now(), consumed_samples=self._consumed_at.get(step),
                                         subrun=self._subrun())
        return self._checkpoint_event(line) or self._rank_timings(line) or self._death(line)

    def _refuse(self, field_name: str, raw: str, reason: str, line: str) -> None:
        self._refused.append(RefusedValue(self._subrun(), self._now(), field_name, printable(raw.strip(), RAW_CHARS),
                                          reason, printable(line.strip(), LINE_CHARS)))

    def _line_step(self, text: str, what: str, line: str) -> Optional[int]:
        """The iteration a save or load line names: a whole number from 0 below 2^63; else None,
        refused as ``what``."""
        value = whole_number(text)
        problem = whole_problem(value, 0)
        if problem is not None:
            self._refuse(what, text, problem, line)
            return None
        return int(value)  # type: ignore[arg-type]

    def _checked_iteration(self, line: str, match: re.Match) -> Optional[StepObservation]:
        """An iteration line whose iteration can be: 1 to its own total, below 2^63."""
        raw, total_text = match.group(1), match.group(2)
        step, total = whole_number(raw), whole_number(total_text)
        total_problem = whole_problem(total, 0)
        problem = f"its total is {total_problem}" if total_problem is not None else whole_problem(step, 1)
        if problem is None and total and step > total:  # type: ignore[operator]
            problem = f"past its own total {total}"
        if problem is not None:
            self._refuse("iteration", f"{raw}/{total_text}", problem, line)
            return None
        return self._iteration(line, int(step), parse_fields(match.group(3)))  # type: ignore[arg-type]

    def _checkpoint_event(self, line: str) -> Optional[Union[SaveStarted, LoadedCheckpoint]]:
        saving = _SAVING.search(line)
        if saving:
            step = self._line_step(saving.group(1), "saving iteration", line)
            return SaveStarted(step=step, time=self._now(), subrun=self._subrun()) if step is not None else None
        loaded = _LOADED.search(line)
        if loaded:
            step = self._line_step(loaded.group(2), "loaded iteration", line)
            if step is None:
                return None
            return LoadedCheckpoint(step=step, path=loaded.group(1), time=self._now(), subrun=self._subrun())
        return None

    def _rank_timings(self, line: str) -> Optional[RankTimings]:
        """The straggler report: the fastest and the slowest rank's mean iteration time."""
        found = _STRAGGLER.search(line)
        if not found:
            return None
        fastest_ms, fastest, slowest_ms, slowest = found.groups()
        times = [_seconds_of_ms(number(fastest_ms)), _seconds_of_ms(number(slowest_ms))]
        ranks = [whole_number(fastest), whole_number(slowest)]
        problems = [p for p in [*(real_problem(t, highest=MAX_ITERATION_S) for t in times),
                                *(whole_problem(r, 0, MAX_RANK) for r in ranks)] if p is not None]
        if problems:
            self._refuse("straggler report", found.group(0), problems[0], line)
            return None
        seconds = {int(ranks[0]): times[0], int(ranks[1]): times[1]}  # type: ignore[arg-type]
        step = self._previous.step if self._previous is not None else 0
        return RankTimings(step=step, time=self._now(), subrun=self._subrun(), seconds=seconds)

    def _subrun(self) -> str:
        return self._subrun_id if self._subrun_id is not None else f"{self._subrun_index:02d}"

    def _now(self) -> float:
        if self._received_at is not None:
            return self._received_at
        return self._previous.time if self._previous is not None else 0.0

    def _iteration(self, line: str, step: int, fields: dict[str, str]) -> StepObservation:
        previous = self._previous
        if previous is not None and step <= previous.step:
            self._subrun_index += 1  # the job restarted from a checkpoint
            previous = None
        iterations = step - previous.step if previous is not None else 1
        check = _FieldCheck(fields, line, self._refuse)
        step_time = check.seconds()
        obs = StepObservation(
            step=step,
            time=self._time(line, fields, step_time, iterations),
            subrun=self._subrun(),
            loss=check.real("lm loss" if "lm loss" in fields else "loss", nonfinite_ok=True),
            grad_norm=check.real("grad norm", nonfinite_ok=True),
            lr=check.real("learning rate"),
            loss_scale=check.real("loss scale", above_lowest=True),
            consumed_samples=check.whole("consumed samples", 0),
            global_batch=check.whole("global batch size", 1),
            step_time=step_time,
            tokens_per_s=check.tokens_per_s(),
            iterations=iterations,
            # A line covers its log interval: the first one after a restart may cover more than one.
            skipped_iterations=check.whole("number of skipped iterations", 0, iterations if previous else step) or 0,
            nan_iterations=check.whole("number of nan iterations", 0, iterations if previous else step) or 0,
        )
        self._consumed_at[step] = obs.consumed_samples
        self._previous = obs
        return obs

    def _time(self, line: str, fields: dict[str, str], step_time: Optional[float], iterations: int) -> float:
        if self._received_at is not None:
            return self._received_at
        stamped = stamp_seconds(line)
        if stamped is not None:
            return stamped
        unix = number(fields.get("current time"))
        if unix is not None and real_problem(unix) is None:
            return unix
        return self._now() + (step_time or 0.0) * iterations

    def _death(self, line: str) -> Optional[WorkerExit]:
        cause = classify(line)
        if cause.category in ("unknown", "bug"):
            return None
        rank = _RANK.search(line)
        found = next((g for g in rank.groups() if g is not None), None) if rank else None
        return WorkerExit(rank=int(found) if found is not None else -1, node="", text=line.strip(),
                          time=self._now(), subrun=self._subrun())


def _seconds_of_ms(ms: Optional[float]) -> Optional[float]:
    return ms / 1000.0 if ms is not None else None


class _FieldCheck:
    """The fields of one iteration line, each read and checked (a refused one is None)."""

    def __init__(self, fields: dict[str, str], line: str, refuse) -> None:
        self.fields, self.line, self.refuse = fields, line, refuse

    def whole(self, key: str, minimum: int, maximum: int = INT64_MAX) -> Optional[int]:
        raw = self.fields.get(key)
        if raw is None:
            return None
        value = whole_number(raw)
        problem = whole_problem(value, minimum, maximum)
        if problem is not None:
            self.refuse(key, raw, problem, self.line)
            return None
        return int(value)  # type: ignore[arg-type]

    def real(self, key: str, above_lowest: bool = False, nonfinite_ok: bool = False,
             scale: float = 1.0, highest: float = math.inf, name: Optional[str] = None) -> Optional[float]:
        """Field ``key`` as a measurement (None when absent or refused, as ``name`` or ``key``)."""
        raw = self.fields.get(key)
        if raw is None:
            return None
        value = number(raw)
        value = value * scale if value is not None else None
        problem = real_problem(value, above_lowest=above_lowest, nonfinite_ok=nonfinite_ok, highest=highest)
        if problem is not None:
            self.refuse(name or key, raw, problem, self.line)
            return None
        return value

    def seconds(self) -> Optional[float]:
        """The elapsed time per iteration in seconds (its key says ms or s; a key that says
        neither is refused: its number could be either)."""
        for key in self.fields:
            if key.startswith(ELAPSED):
                unit = next((unit for unit in ("(ms)", "(s)") if unit in key), None)
                if unit is None:
                    self.refuse(ELAPSED, self.fields[key], f"no unit in its key {key[:60]!r}", self.line)
                    return None
                return self.real(key, scale=0.001 if unit == "(ms)" else 1.0, highest=MAX_ITERATION_S,
                                 name=f"{ELAPSED} {unit}")
        return None

    def tokens_per_s(self) -> Optional[float]:
        """The throughput in tokens per second, under whichever key the version prints it."""
        for key in self.fields:
            if "token" in key and ("/s" in key or "sec" in key or key.startswith("tgs")):
                return self.real(key, name=TOKENS_PER_S)
        return None
