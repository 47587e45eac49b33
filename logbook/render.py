"""The chronicle: a run's lineage as text a person enjoys reading, in the
spirit of OPT-175B's logbook. Pure functions from logbook records to lines."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import PurePosixPath
from typing import Any, Mapping, Optional, Sequence

from logbook.accounting import SubRunCost
from logbook.records import SubRun

INDENT = " " * 6
"""Body lines of a sub-run sit under its text, past the ``12.03`` column."""

_PLAN_KEYS_SHOWN_ELSEWHERE = ("subrun", "start_checkpoint")


def chronicle(
    title: str, lineage: Sequence[SubRun], events: Sequence[dict], metrics: Sequence[dict],
    costs: Mapping[str, SubRunCost], summary: Mapping[str, Any], width: int = 100,
) -> list[str]:
    """The whole timeline: a header of run figures, then one block per sub-run."""
    lines = header(title, summary, width)
    previous: Optional[SubRun] = None
    for subrun in lineage:
        lines.append("")
        lines += subrun_block(
            subrun, previous, [e for e in events if e["subrun"] == subrun.id],
            [m for m in metrics if m["subrun"] == subrun.id], costs.get(subrun.id), width,
        )
        previous = subrun
    return lines


def header(title: str, summary: Mapping[str, Any], width: int) -> list[str]:
    """Run-level figures: when, how long, sub-runs, steps, incidents, ETTR."""
    incidents = summary["incidents"]
    incident_text = f"incidents {sum(incidents.values())}"
    if incidents:
        incident_text += " (" + ", ".join(f"{kind} {n}" for kind, n in sorted(incidents.items())) + ")"
    started = "-" if summary["started_at"] is None else clock_text(summary["started_at"], with_date=True)
    ettr = "ETTR -"
    if summary["ettr"] is not None:
        ettr = (f"ETTR {summary['ettr']:.1%} ({duration(summary['kept_time_s'])} of "
                f"{duration(summary['wall_time_s'])} on kept steps)")
    fields = [
        f"started {started}", f"wall time {duration(summary['wall_time_s'])}",
        f"sub-runs {summary['subruns']}", incident_text,
        f"steps kept {summary['steps_kept']} (last {summary['last_step']})",
        f"steps lost {summary['steps_lost']}", f"checkpoints {summary['checkpoints']}", ettr,
    ]
    return [title] + pack(fields, width, indent="  ")


def pack(fields: Sequence[str], width: int, indent: str, separator: str = "   ") -> list[str]:
    """Lay unbreakable fields side by side, starting a new line when one would overflow."""
    lines: list[str] = []
    current = ""
    for field in fields:
        candidate = f"{current}{separator}{field}" if current else indent + field
        if current and len(candidate) > width:
            lines.append(current)
            candidate = indent + field
        current = candidate
    return lines + ([current] if current else [])


def subrun_block(
    subrun: SubRun, previous: Optional[SubRun], events: Sequence[dict], metrics: Sequence[dict],
    cost: Optional[SubRunCost], width: int,
) -> list[str]:
    """One sub-run: start, cost, changes, what happened, checkpoints, end."""
    # The header carries the first date; later blocks repeat it only when the day turns.
    new_day = previous is not None and _day(previous.started_at) != _day(subrun.started_at)
    start = f"{subrun.id:<5} started {clock_text(subrun.started_at, with_date=new_day)}"
    if subrun.start_checkpoint:
        start += f" from {PurePosixPath(subrun.start_checkpoint).name} (step {subrun.start_step})"
    start += f" — cause: {subrun.cause}"
    if subrun.evidence:
        start += f" ({compact(subrun.evidence)})"
    lines = wrap(start, width, INDENT)
    if cost is not None and (cost.lost_steps or cost.downtime):
        lines += _body(f"steps lost: {cost.lost_steps} ({duration(cost.lost_step_time)} of training redone), "
                       f"down {duration(cost.downtime)} before this start", width)
    if subrun.config_diff:
        changes = ", ".join(f"{key} {_value(old)} → {_value(new)}" for key, (old, new) in subrun.config_diff.items())
        lines += _body(f"config: {changes}", width)
    plan_text = plan_changes(previous.plan if previous else {}, subrun.plan)
    if plan_text:
        lines += _body(f"plan: {plan_text}", width)
    if metrics:
        lines += _body(progress(metrics), width)
    for event in events:
        lines += happening(event, width)
    checkpoints = [e for e in events if e["type"] == "checkpoint"]
    if checkpoints:
        last = checkpoints[-1]
        lines += _body(f"checkpoints: {len(checkpoints)}, last {PurePosixPath(last['path']).name} "
                       f"(step {last['step']})", width)
    lines += _body(ending(subrun), width)
    return lines


def happening(event: dict, width: int) -> list[str]:
    """An incident, decision or free-form event as a timed line (others: none)."""
    at = clock_text(event["time"])
    if event["type"] == "incident":
        where = f" at step {event['step']}" if event["step"] is not None else ""
        who = ", ".join(filter(None, [_listing("rank", event["ranks"]), _listing("node", event["nodes"])]))
        text = f"{at}  incident #{event['id']} {event['kind']}{where}{', ' + who if who else ''}: {event['summary']}"
        if event["evidence"]:
            text += f" ({compact(event['evidence'])})"
    elif event["type"] == "decision":
        about = f" on #{event['incident_id']}" if event["incident_id"] is not None else ""
        text = f"{at}  decision{about}: {event['action']} — {event['reason']}"
    elif event["type"] == "event":
        where = f" at step {event['step']}" if event["step"] is not None else ""
        text = f"{at}  {event['kind']}{where}: {event['message']}"
    else:
        return []
    return wrap(INDENT + text, width, INDENT + " " * 10)


def ending(subrun: SubRun) -> str:
    """How the sub-run ended, or that no end is recorded."""
    if subrun.is_open:
        step = "" if subrun.last_step is None else f" (last step {subrun.last_step})"
        return f"no end recorded{step}: still running, or its driver died"
    at = clock_text(subrun.ended_at)
    if subrun.end_state == "finished":
        text = f"finished at step {subrun.last_step} ({at})"
    else:
        text = f"ended {at}: {subrun.end_state} at step {subrun.last_step}"
    return text + (f" — {subrun.end_reason}" if subrun.end_reason else "")


def progress(metrics: Sequence[dict]) -> str:
    """Steps trained and how the loss moved, from this sub-run's metrics."""
    first, last = metrics[0], metrics[-1]
    text = f"trained steps {first['step']}–{last['step']} ({len(metrics)} recorded)"
    if first["loss"] is not None and last["loss"] is not None:
        text += f", loss {first['loss']:.4g} → {last['loss']:.4g}"
    return text


def plan_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """Plan entries that changed, as ``key old → new``; new ones as ``key=value``."""
    parts = []
    for key in sorted(set(before) | set(after)):
        if key in _PLAN_KEYS_SHOWN_ELSEWHERE or before.get(key) == after.get(key):
            continue
        if key not in before and not after.get(key):
            continue  # a neutral setting on its first appearance is no news
        if key not in after:
            parts.append(f"{key} {_value(before[key])} → (unset)")
        elif key in before:
            parts.append(f"{key} {_value(before[key])} → {_value(after[key])}")
        else:
            parts.append(f"{key}={_value(after[key])}")
    return ", ".join(parts)


def compact(data: Mapping[str, Any], limit: int = 60) -> str:
    """``k=v, k=v`` with each value cut to ``limit`` characters."""
    return ", ".join(f"{key}={_value(value, limit)}" for key, value in data.items())


def clock_text(timestamp: float, with_date: bool = False) -> str:
    """Local wall-clock time, with the date when asked."""
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(timestamp))


def duration(seconds: Optional[float]) -> str:
    """``3.5 s``, ``4m 12s``, ``2h 03m``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def wrap(line: str, width: int, indent: str) -> list[str]:
    """Wrap a long line with a hanging indent; short lines are left alone."""
    if len(line) <= width:
        return [line]
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False)


def _body(text: str, width: int) -> list[str]:
    return wrap(INDENT + text, width, INDENT + "  ")


def _value(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _listing(word: str, items: Sequence[Any]) -> str:
    if not items:
        return ""
    return f"{word}{'s' if len(items) > 1 else ''} {', '.join(str(i) for i in items)}"


def _day(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(timestamp))
