"""Offline replay: the detectors and the policy over a recorded log, through the
same judge as a live run.

``runmgr watch replay FILE [conf=NAME] [key=value ...] [--json]`` reads our
logbook's JSONL or a Megatron-LM / MindSpeed-LLM training log and feeds every
observation to a :class:`~runmgr.controller.judge.Judge` built from the run's
own watcher and policy config, with the observation's own time as ``now`` and
the checkpoints the log recorded so far. Nothing is trained or executed. When
a decision ends a sub-run, the replay goes on as a live run would: the log's
next lines are taken as the next sub-run (``00+1``, ...), so a post-mortem of a
long log sees every incident, not just the first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, TextIO

from runmgr.config.compose import load_run_config
from runmgr.controller.judge import Judge
from runmgr.controller.judgement import Judgement
from runmgr.errors import UserError
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.config.policy import PolicyConfig
from runmgr.config.watcher import WatcherConfig
from runmgr.watch.errors import ReplayInputError
from runmgr.watch.megatron_log import LogEvent, MegatronLogReader
from runmgr.watch.metrics_jsonl import read_jsonl
from runmgr.watch.observations import CheckpointObservation, RefusedValue, StepObservation

FORMAT_HELP = ("expected `runmgr logbook metrics` JSONL or a Megatron-LM/MindSpeed-LLM training log "
               "with `iteration N/ M | ...` lines")


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
    outcomes: tuple[Judgement, ...] = field(default=())
    """Each incident and what the policy decided about it, in order."""
    refused: tuple[RefusedValue, ...] = field(default=())
    """Every value of the log the reader refused (an absurd number), in order."""


def replay(events: Iterable[LogEvent], source_format: str, watcher_config: Optional[WatcherConfig] = None,
           policy_config: Optional[PolicyConfig] = None, save_interval: Optional[int] = None) -> ReplayResult:
    """Detect and decide over ``events`` in order, as a live run's judge would.

    ``save_interval`` assumes a verified checkpoint every that many steps
    reached, for logs that do not record their checkpoints.
    """
    checkpoints: dict[int, VerifiedCheckpoint] = {}
    judge = Judge(watcher_config or WatcherConfig(), policy_config or PolicyConfig(),
                  lambda max_step: [c for c in checkpoints.values() if c.step <= max_step])
    subruns = _SubrunLabels()
    outcomes: list[Judgement] = []
    steps: list[StepObservation] = []
    refused: list[RefusedValue] = []
    for event in events:
        if isinstance(event, RefusedValue):
            refused.append(event)
            continue
        if isinstance(event, CheckpointObservation):
            checkpoints[event.step] = VerifiedCheckpoint(event.step, event.consumed_samples)
            continue
        if subruns.log_restarted(event.subrun):
            judge.restart_detectors({})
        event = subruns.relabel(event)
        if isinstance(event, StepObservation):
            _assume_checkpoint(event, steps[-1] if steps else None, save_interval, checkpoints)
            steps.append(event)
        last_step = steps[-1].step if steps else 0
        judgements = judge.judge_observations([event], event.time, last_step)
        outcomes += judgements
        if any(j.ends_subrun for j in judgements):
            subruns.end_current()
            judge.restart_detectors({})
    return ReplayResult(
        source_format=source_format, steps=len(steps),
        first_step=min((s.step for s in steps), default=None), last_step=max((s.step for s in steps), default=None),
        subruns=subruns.from_log(),
        checkpoints=tuple(sorted(checkpoints.values(), key=lambda c: c.step)), outcomes=tuple(outcomes),
        refused=tuple(refused),
    )


class _SubrunLabels:
    """The log's own sub-runs, and the ones the replay's decisions started: after a
    decision that ends sub-run ``00``, the log's next lines are ``00+1``."""

    def __init__(self) -> None:
        self._seen: list[str] = []
        self._continuations = 0

    def log_restarted(self, subrun: str) -> bool:
        """True when the log itself moved on to another sub-run (its job restarted)."""
        if self._seen and subrun == self._seen[-1]:
            return False
        self._seen.append(subrun)
        self._continuations = 0
        return len(self._seen) > 1

    def end_current(self) -> None:
        self._continuations += 1

    def relabel(self, event: LogEvent) -> LogEvent:
        if not self._continuations or not hasattr(event, "subrun"):
            return event
        return replace(event, subrun=f"{event.subrun}+{self._continuations}")

    def from_log(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self._seen))


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
    lines += refused_lines(result.refused)
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


def refused_lines(refused: Sequence[RefusedValue], shown: int = 5) -> list[str]:
    """How many values the reader refused, by field, and the first few of them."""
    if not refused:
        return []
    counts: dict[str, int] = {}
    for value in refused:
        counts[value.field] = counts.get(value.field, 0) + 1
    tally = ", ".join(f"{name} x{count}" for name, count in counts.items())
    lines = [f"{len(refused)} value(s) refused as impossible ({tally}):"]
    lines += [f"  {value.field} {value.raw!r}: {value.reason}" for value in refused[:shown]]
    if len(refused) > shown:
        lines.append(f"  ... and {len(refused) - shown} more (--json lists them all)")
    return lines


def render_json(result: ReplayResult, source: str) -> str:
    """The replay as one JSON document."""
    return json.dumps({
        "file": source, "format": result.source_format, "steps": result.steps,
        "first_step": result.first_step, "last_step": result.last_step, "subruns": list(result.subruns),
        "checkpoints": [{"step": c.step, "consumed_samples": c.consumed_samples} for c in result.checkpoints],
        "incidents": [{"incident": o.incident.to_dict(), "decision": o.decision.to_dict()}
                      for o in result.outcomes],
        "refused": [{"field": r.field, "raw": r.raw, "reason": r.reason, "line": r.line} for r in result.refused],
    }, indent=2, default=str) + "\n"


def main_replay(path: str, as_json: bool, out: TextIO, err: Optional[TextIO] = None,
                save_interval: Optional[int] = None, conf: Optional[str] = None, overrides: Sequence[str] = (),
                conf_dir: Optional[Path] = None) -> int:
    """``runmgr watch replay``: 0 after printing, 2 with one line on ``err`` for a bad
    file. ``conf`` and ``overrides`` compose the run's config as ``launch`` does, so
    the replay uses its watcher and policy settings; without them, the defaults."""
    err = err if err is not None else sys.stderr
    try:
        watcher, policy = _judging_config(conf, overrides, conf_dir)
        lines = _read_lines(path)
        fmt, events = read_events(lines, path)
    except UserError as problem:  # a bad file, conf or override: one line
        err.write(f"runmgr watch replay: {problem}\n")
        return 2
    result = replay(events, fmt, watcher, policy, save_interval=save_interval)
    out.write(render_json(result, path) if as_json else render_text(result, path))
    return 0


def _judging_config(conf: Optional[str], overrides: Sequence[str],
                    conf_dir: Optional[Path]) -> tuple[WatcherConfig, PolicyConfig]:
    if conf is None:
        if overrides:
            raise ReplayInputError(f"{overrides[0]}: key=value overrides need a config to apply to, "
                                   f"e.g. `runmgr watch replay FILE conf=demo {overrides[0]}`")
        return WatcherConfig(), PolicyConfig()
    config = load_run_config(conf, list(overrides), conf_dir)
    return config.watcher, config.policy


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
