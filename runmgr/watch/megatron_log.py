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
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Optional, Union

from runmgr.watch.deaths import classify
from runmgr.watch.observations import (
    CheckpointObservation, LoadedCheckpoint, RankTimings, SaveStarted, StepObservation, WorkerExit,
)

LogEvent = Union[StepObservation, CheckpointObservation, WorkerExit, RankTimings, SaveStarted, LoadedCheckpoint]

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_STAMP = re.compile(r"\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\]")
_SAVED = re.compile(r"successfully saved checkpoint (?:at|from) iteration\s+(\d+)")
_SAVING = re.compile(r"saving checkpoint at iteration\s+(\d+) to ")
_LOADED = re.compile(r"successfully loaded checkpoint from (\S+).*?\bat iteration\s+(\d+)")
_STRAGGLER = re.compile(r"MnRtt/Rnk:\s*([\d.]+)ms/(\d+)\s*\|\s*MxRtt/Rnk:\s*([\d.]+)ms/(\d+)")
_RANK = re.compile(r"\[[Rr]ank\s*(\d+)\]|\[rank(\d+)\]:")
_NUMBER = re.compile(r"[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)",
                     re.IGNORECASE)


def parse_fields(rest: str) -> dict[str, str]:
    """``key: value | key: value |`` into a dict (keys lower-cased, values raw)."""
    fields = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(": ")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def number(text: Optional[str]) -> Optional[float]:
    """The first number in ``text`` (``nan``/``inf`` included); None when there is none."""
    if text is None:
        return None
    match = _NUMBER.search(text)
    return float(match.group(0)) if match else None


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

    def events(self, lines: Iterable[str]) -> Iterator[LogEvent]:
        """Every observation the lines hold, in order."""
        for line in lines:
            event = self.parse(line)
            if event is not None:
                yield event

    def parse(self, line: str, received_at: Optional[float] = None) -> Optional[LogEvent]:
        """The observation one line holds, if any. ``received_at`` (a live job: when the line
        arrived) is the observation's time; without it, the line's own stamp or the log's clock."""
        self._received_at = received_at
        match = _ITERATION.search(line)
        if match:
            return self._iteration(line, int(match.group(1)), parse_fields(match.group(3)))
        saved = _SAVED.search(line)
        if saved:
            step = int(saved.group(1))
            return CheckpointObservation(step=step, time=self._now(), consumed_samples=self._consumed_at.get(step),
                                         subrun=self._subrun())
        return self._checkpoint_event(line) or self._rank_timings(line) or self._death(line)

    def _checkpoint_event(self, line: str) -> Optional[Union[SaveStarted, LoadedCheckpoint]]:
        saving = _SAVING.search(line)
        if saving:
            return SaveStarted(step=int(saving.group(1)), time=self._now(), subrun=self._subrun())
        loaded = _LOADED.search(line)
        if loaded:
            return LoadedCheckpoint(step=int(loaded.group(2)), path=loaded.group(1), time=self._now(),
                                    subrun=self._subrun())
        return None

    def _rank_timings(self, line: str) -> Optional[RankTimings]:
        """The straggler report: the fastest and the slowest rank's mean iteration time."""
        found = _STRAGGLER.search(line)
        if not found:
            return None
        fastest_ms, fastest, slowest_ms, slowest = found.groups()
        seconds = {int(fastest): float(fastest_ms) / 1000.0, int(slowest): float(slowest_ms) / 1000.0}
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
        step_time = _step_seconds(fields)
        consumed = number(fields.get("consumed samples"))
        obs = StepObservation(
            step=step,
            time=self._time(line, fields, step_time, iterations),
            subrun=self._subrun(),
            loss=number(fields.get("lm loss", fields.get("loss"))),
            grad_norm=number(fields.get("grad norm")),
            lr=number(fields.get("learning rate")),
            loss_scale=number(fields.get("loss scale")),
            consumed_samples=int(consumed) if consumed is not None else None,
            global_batch=_int(fields.get("global batch size")),
            step_time=step_time,
            tokens_per_s=_tokens_per_s(fields),
            iterations=iterations,
            skipped_iterations=_int(fields.get("number of skipped iterations")) or 0,
            nan_iterations=_int(fields.get("number of nan iterations")) or 0,
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
        if unix is not None:
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


def _step_seconds(fields: dict[str, str]) -> Optional[float]:
    for key, value in fields.items():
        if key.startswith("elapsed time per iteration"):
            seconds = number(value)
            if seconds is None:
                return None
            return seconds / 1000.0 if "(ms)" in key else seconds
    return None


def _tokens_per_s(fields: dict[str, str]) -> Optional[float]:
    for key, value in fields.items():
        if "token" in key and ("/s" in key or "sec" in key or key.startswith("tgs")):
            return number(value)
    return None


def _int(text: Optional[str]) -> Optional[int]:
    value = number(text)
    return int(value) if value is not None and math.isfinite(value) else None
