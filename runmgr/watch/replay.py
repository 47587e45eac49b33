"""Offline replay: run the detectors and the policy over a recorded log.

``runmgr watch replay FILE [--json]`` reads our logbook's JSONL or a
Megatron-LM / MindSpeed-LLM training log, feeds every observation to a
:class:`~runmgr.watch.watcher.Watcher` with the observation's own time as
``now``, asks the policy about each incident (with the checkpoints the log
recorded so far) and prints what it would have done. Nothing is trained and
nothing is executed; decisions are applied only to the policy's history.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TextIO

from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.config import PolicyConfig
from runmgr.policy.decision import Decision
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.watch.config import WatcherConfig
from runmgr.watch.errors import ReplayInputError
from runmgr.watch.incidents import Incident
from runmgr.watch.megatron_log import LogEvent, MegatronLogReader
from runmgr.watch.metrics_jsonl import read_jsonl
from runmgr.watch.observations import CheckpointObservation, StepObservation
from runmgr.watch.watcher import Watcher

FORMAT_HELP = ("expected `runmgr logbook metrics` JSONL or a Megatron-LM/MindSpeed-LLM training log "
               "with `iteration N/ M | ...` lines")


@dataclass(frozen=True)
class Outcome:
    """One incident and what the policy decided about it."""

    incident: Incident
    decision: Decision


@dataclass(frozen=True)
class ReplayResult:
    """What a replay saw and decided."""

    source_format: str
    """``jsonl`` or ``megatron``."""
    steps: int
    """Step observations read (log lines; one may cover several iterations)."""
    first_step: Optional[int]
    last_step: Optional[int]
    subruns: tuple[str, ...]
    checkpoints: tuple[VerifiedCheckpoint, ...]
    outcomes: tuple[Outcome, ...] = field(default=())


def replay(events: Iterable[LogEvent], source_format: str, watcher_config: Optional[WatcherConfig] = None,
           policy_config: Optional[PolicyConfig] = None, save_interval: Optional[int] = None) -> ReplayResult:
    """Detect and decide over ``events`` in order.

    ``save_interval`` assumes a verified checkpoint every that many steps
    reached, for logs that do not record their checkpoints.
    """
    watcher = Watcher(watcher_config or WatcherConfig())
    policy = policy_config or PolicyConfig()
    history = History()
    checkpoints: dict[int, VerifiedCheckpoint] = {}
    outcomes: list[Outcome] = []
    steps: list[StepObservation] = []
    for event in events:
        if isinstance(event, CheckpointObservation):
            checkpoints[event.step] = VerifiedCheckpoint(event.step, event.consumed_samples)
            continue
        if isinstance(event, StepObservation):
            _assume_checkpoint(event, steps[-1] if steps else None, save_interval, checkpoints)
            steps.append(event)
        for incident in watcher.observe(event, event.time):
            known = tuple(checkpoints.values())
            decision = decide(incident, history, policy, known)
            history = history.record(incident, decision, known)
            outcomes.append(Outcome(incident, decision))
    return ReplayResult(
        source_format=source_format, steps=len(steps),
        first_step=min((s.step for s in steps), default=None), last_step=max((s.step for s in steps), default=None),
        subruns=tuple(dict.fromkeys(s.subrun for s in steps)),
        checkpoints=tuple(sorted(checkpoints.values(), key=lambda c: c.step)), outcomes=tuple(outcomes),
    )


def _assume_checkpoint(obs: StepObservation, previous: Optional[StepObservation], save_interval: Optional[int],
                       checkpoints: dict[int, VerifiedCheckpoint]) -> None:
    if not save_interval or previous is None or obs.step <= previous.step:
        return
    crossed = obs.step // save_interval * save_interval
    if crossed > previous.step and crossed == obs.step:
        checkpoints[crossed] = VerifiedCheckpoint(crossed, obs.consumed_samples)


def read_events(lines: Sequence[str], source: str) -> tuple[str, list[LogEvent]]:
    """The format of ``lines`` and its observations; refuses a file without training steps."""
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("{"):
        fmt, events = "jsonl", read_jsonl(lines, source)
    else:
        fmt, events = "megatron", list(MegatronLogReader().events(lines))
    if not any(isinstance(e, StepObservation) for e in events):
        raise ReplayInputError(f"no training steps found in {source}: {FORMAT_HELP}")
    return fmt, events


def render_text(result: ReplayResult, source: str) -> str:
    """The replay for a terminal: a header, then each incident and its decision."""
    span = f"steps {result.first_step}-{result.last_step}" if result.steps else "no steps"
    lines = [f"replay of {source} ({result.source_format}): {result.steps} step records, {span}, "
             f"{len(result.subruns)} sub-run(s), {len(result.checkpoints)} checkpoint(s) recorded"]
    if not result.outcomes:
        lines.append("no incidents")
        return "\n".join(lines) + "\n"
    lines.append(f"{len(result.outcomes)} incident(s):")
    for number, outcome in enumerate(result.outcomes, start=1):
        incident, decision = outcome.incident, outcome.decision
        state = " (recovered)" if incident.recovered else ""
        lines.append(f"  {number}. {incident.summary()}{state}")
        lines.append(f"     -> {decision.action}: {decision.reason}")
    return "\n".join(lines) + "\n"


def render_json(result: ReplayResult, source: str) -> str:
    """The replay as one JSON document."""
    return json.dumps({
        "file": source, "format": result.source_format, "steps": result.steps,
        "first_step": result.first_step, "last_step": result.last_step, "subruns": list(result.subruns),
        "checkpoints": [{"step": c.step, "consumed_samples": c.consumed_samples} for c in result.checkpoints],
        "incidents": [{"incident": o.incident.to_dict(), "decision": o.decision.to_dict()}
                      for o in result.outcomes],
    }, indent=2, default=str) + "\n"


def main_replay(path: str, as_json: bool, out: TextIO, err: Optional[TextIO] = None,
                save_interval: Optional[int] = None) -> int:
    """``runmgr watch replay``: 0 after printing, 2 with one line on ``err`` for a bad file."""
    err = err if err is not None else sys.stderr
    try:
        lines = _read_lines(path)
        fmt, events = read_events(lines, path)
    except ReplayInputError as problem:
        err.write(f"runmgr watch replay: {problem}\n")
        return 2
    result = replay(events, fmt, save_interval=save_interval)
    out.write(render_json(result, path) if as_json else render_text(result, path))
    return 0


def _read_lines(path: str) -> list[str]:
    file = Path(path)
    if not file.exists():
        raise ReplayInputError(f"no such file: {path}; pass a logbook metrics JSONL or a Megatron training log")
    if file.is_dir():
        raise ReplayInputError(f"{path} is a directory; pass the log file itself")
    try:
        with file.open(encoding="utf-8", errors="replace", newline="") as handle:
            return handle.readlines()
    except OSError as problem:
        raise ReplayInputError(f"cannot read {path}: {problem.strerror or problem}") from None
