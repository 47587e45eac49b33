"""The chronicle: a run's lineage as text a person who was not there can
read, in the spirit of OPT-175B's logbook. Pure functions from logbook
records to lines.

Each sub-run gets one start line (id, time, checkpoint, why), the few facts
that matter (what it cost, what changed, rejected checkpoints), one line per
incident with its decision under it, its checkpoints and its end. Evidence
dicts stay out of it: ``runmgr logbook events`` prints them whole.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, Callable, Mapping, Optional, Sequence

from logbook.accounting import SubRunCost
from logbook.changes import config_changes, health_fact, node_changes, plan_changes
from logbook.incident_costs import ClassCost
from logbook.records import SubRun
from logbook.textfmt import clock_text, day, duration, listing, pack, phrases, tidier, wrap

__all__ = ["INDENT", "cause_text", "chronicle", "class_cost_block", "duration", "ending", "header", "pack", "plan_changes",
           "run_title", "subrun_block"]

INDENT = " " * 6
"""Body lines of a sub-run sit under its text, past the ``12.03`` column."""
EVENT_INDENT = INDENT + " " * 10
"""Continuations of a timed line sit under its text, past ``HH:MM:SS``."""
MAX_ENTRY_LINES = 3
"""An incident or decision longer than this is cut with "…" (``show --full`` prints it whole)."""
SHOWN_AS_FACTS = ("workers_started", "checkpoint_rejected")
"""Events told among a sub-run's start facts rather than as timed lines."""

RELAUNCH = "relaunch: "
"""How ``runmgr launch`` words the cause of a sub-run that resumes a stopped lineage."""

Tidy = Callable[[str], str]


def run_title(lineage: Sequence[SubRun]) -> str:
    """``demo — run 1``: the first sub-run's ``run.name`` and ``run.number``."""
    if not lineage:
        return "run (no sub-runs yet)"
    run = lineage[0].config.get("run")
    run = run if isinstance(run, Mapping) else {}
    number = run.get("number", lineage[0].id.split(".")[0])
    rehearse = lineage[0].config.get("rehearse")
    of = rehearse.get("of") if isinstance(rehearse, Mapping) else None
    mark = f" — a rehearsal of {of} (runmgr launch --rehearse)" if of else ""
    return (f"{run['name']} — run {number}" if run.get("name") else f"run {number}") + mark


def chronicle(
    title: str, lineage: Sequence[SubRun], events: Sequence[dict], metrics: Sequence[dict],
    costs: Mapping[str, SubRunCost], summary: Mapping[str, Any], width: int = 100,
    run_dir: Optional[str] = None, full: bool = False, recorded: Optional[Mapping[str, int]] = None,
) -> list[str]:
    """The whole timeline: a header of run figures, then one block per sub-run.

    Paths under ``run_dir`` (or the run directory each sub-run's config
    recorded) are shown relative to it, and the header says so. ``full``
    prints incidents and decisions whole instead of cutting them at
    :data:`MAX_ENTRY_LINES`. ``recorded``: rows per sub-run, when ``metrics``
    holds only each sub-run's first and last rows (a long run's chronicle).
    """
    tidy = tidier([run_dir, *(_recorded_run_dir(subrun) for subrun in lineage)])
    lines = header(title, summary, width)
    if run_dir:
        lines.append("  paths below are relative to the run directory")
    previous: Optional[SubRun] = None
    for subrun in lineage:
        lines.append("")
        lines += subrun_block(
            subrun, previous, [e for e in events if e["subrun"] == subrun.id],
            [m for m in metrics if m["subrun"] == subrun.id], costs.get(subrun.id), width, tidy,
            max_entry_lines=None if full else MAX_ENTRY_LINES,
            recorded=None if recorded is None else recorded.get(subrun.id, 0),
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
        ettr = (f"ETTR {summary['ettr']:.1%} (effective training time ratio: time on kept steps / wall time"
                f" = {duration(summary['kept_time_s'])} / {duration(summary['wall_time_s'])})")
    fields = [
        f"started {started}", f"wall time {duration(summary['wall_time_s'])}"
        + (f" (less {duration(summary['paused_s'])} stopped by a person)" if summary.get("paused_s") else ""),
        f"sub-runs {summary['subruns']}", incident_text,
        f"steps kept {summary['steps_kept']} (last {summary['last_step']})",
        f"steps lost {summary['steps_lost']}", f"checkpoints {summary['checkpoints']}",
    ]
    return [title] + pack(fields, width, indent="  ") + wrap("  " + ettr, width, "    ")


def class_cost_block(costs: Sequence[ClassCost], mtbi_s: Optional[float], ettr_series: Sequence[tuple[float, float]],
                     width: int) -> list[str]:
    """What each incident class cost (the most wall time lost first), MTBI, and ETTR
    at each sub-run's end (definitions: logbook.accounting, logbook.incident_costs)."""
    lines = []
    if costs:
        lines.append("  cost by incident class: count, sub-runs ended, steps lost, wall time lost "
                     "(redone training + down + restart)")
        kind_width = max(len(cost.kind) for cost in costs)
        for cost in costs:
            lines += wrap(f"    {cost.kind:<{kind_width}}  {cost.incidents:>3}  {cost.restarts:>3} ended  "
                          f"{cost.steps_lost:>6} steps  {duration(cost.wall_lost_s):>8} ({duration(cost.redone_s)} "
                          f"+ {duration(cost.downtime_s)} + {duration(cost.restart_s)})", width, "      ")
    if mtbi_s is not None:
        lines.append(f"  MTBI {duration(mtbi_s)} (mean time between incidents that ended a sub-run)")
    if ettr_series:
        lines += phrases("ETTR at each sub-run's end: ", [f"{ettr:.1%}" for _, ettr in ettr_series], width,
                         "  ", "    ", separator=",")
    return lines


def subrun_block(
    subrun: SubRun, previous: Optional[SubRun], events: Sequence[dict], metrics: Sequence[dict],
    cost: Optional[SubRunCost], width: int, tidy: Tidy = str, max_entry_lines: Optional[int] = MAX_ENTRY_LINES,
    recorded: Optional[int] = None,
) -> list[str]:
    """One sub-run: start, facts, progress, incidents and decisions, checkpoints, end."""
    lines = wrap(tidy(start_line(subrun, previous, tidy)), width, INDENT)
    if cost is not None and (cost.lost_steps or cost.downtime):
        lines += _body(cost_text(cost), width)
    changes = [tidy(change) for change in changes_of(subrun, previous)]
    if changes:
        lines += phrases("changed: ", changes, width, INDENT, INDENT + "  ")
    for fact in start_facts(subrun, events):
        lines += _body(tidy(fact), width)
    if metrics:
        lines += _body(progress(metrics, recorded), width)
    shown: list[str] = []
    lines += happenings(events, width, tidy, shown, max_entry_lines)
    checkpoints = [e for e in events if e["type"] == "checkpoint"]
    if checkpoints:
        last = checkpoints[-1]
        lines += _body(f"checkpoints: {len(checkpoints)}, last {PurePosixPath(last['path']).name} "
                       f"(step {last['step']})", width)
    lines += _body(tidy(ending(subrun, shown)), width)
    return lines


def start_line(subrun: SubRun, previous: Optional[SubRun], tidy: Tidy = str) -> str:
    """``1.01  21:00:42  from step_00000020 (step 20)  after: worker_death at step 23 (rank 1 killed)``."""
    # The header carries the first date; later starts repeat it only when the day turns.
    new_day = previous is not None and day(previous.started_at) != day(subrun.started_at)
    if _evidence(subrun).get("restart") == "warm":
        where = f"warm from memory (step {subrun.start_step})"
    elif subrun.start_checkpoint:
        where = f"from {PurePosixPath(subrun.start_checkpoint).name} (step {subrun.start_step})"
    else:
        where = "from scratch" if subrun.start_step == 0 else f"from step {subrun.start_step}"
    return f"{subrun.id:<5} {clock_text(subrun.started_at, with_date=new_day)}  {where}  {cause_text(subrun, tidy)}"


def cause_text(subrun: SubRun, tidy: Tidy = str) -> str:
    """Why the sub-run started, short: the incident's kind, step and culprits."""
    incident = _evidence(subrun).get("incident")
    if isinstance(incident, Mapping) and incident.get("kind"):
        return "after: " + incident_headline(incident, tidy)
    if subrun.cause == "launch":
        return "(first launch)"
    if subrun.cause.startswith(RELAUNCH):
        return f"after: relaunch ({subrun.cause[len(RELAUNCH):]})"
    return f"after: {subrun.cause}"


def incident_headline(incident: Mapping[str, Any], tidy: Tidy = str) -> str:
    """``worker_death at step 23 (rank 1 killed)`` from an incident dict."""
    text = str(incident["kind"])
    if incident.get("onset_step") is not None:
        text += f" at step {incident['onset_step']}"
    who = listing("rank", incident.get("ranks") or ()) or listing("node", incident.get("nodes") or ())
    evidence = incident.get("evidence")
    cause = evidence.get("cause") if isinstance(evidence, Mapping) else None
    detail = " ".join(str(part) for part in (who, cause) if part)
    return text + (f" ({tidy(detail)})" if detail else "")


def cost_text(cost: SubRunCost) -> str:
    """``steps lost: 13 (6.5 s of training redone), down 4.0 s before this start``."""
    text = f"steps lost: {cost.lost_steps} ({duration(cost.lost_step_time)} of training redone)"
    # The controller restarts within milliseconds of an end; "down 0.0 s" would be noise.
    if cost.paused >= 0.05:
        text += f", stopped by a person for {duration(cost.paused)} before this start (not lost)"
    return text + (f", down {duration(cost.downtime)} before this start" if cost.downtime >= 0.05 else "")


def changes_of(subrun: SubRun, previous: Optional[SubRun]) -> list[str]:
    """What this start changed: config keys, plan settings, nodes left out."""
    optim = subrun.config.get("optim")
    clip = optim.get("clip_grad") if isinstance(optim, Mapping) else None
    return (config_changes(subrun.config_diff)
            + plan_changes(_plan(previous) if previous else {}, _plan(subrun), clip_default=clip)
            + node_changes(_evidence(subrun), _evidence(previous) if previous else None))


def start_facts(subrun: SubRun, events: Sequence[dict]) -> list[str]:
    """What the health gate and the checkpoint search found, how long workers took to start."""
    facts = []
    health = health_fact(_evidence(subrun))
    if health:
        facts.append(health)
    for event in events:
        if event["type"] != "event":
            continue
        if event["kind"] == "checkpoint_rejected":
            facts.append(rejected_text(event))
        elif event["kind"] == "workers_started":
            facts.append(workers_text(event, subrun.started_at))
    return facts


def rejected_text(event: dict) -> str:
    """``rejected step_00000030: manifest missing`` (the reason as recorded)."""
    data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
    if "path" not in data:
        return f"rejected: {event['message']}"
    return f"rejected {PurePosixPath(str(data['path'])).name}: {data.get('reason', 'no reason recorded')}"


def workers_text(event: dict, started_at: float) -> str:
    """``2 workers up in 1.4 s`` (how long the start took, of the downtime)."""
    data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
    workers = data.get("workers")
    count = len(workers) if isinstance(workers, list) else data.get("worker_count")  # many: summed up per node
    what = f"{count} worker{'s' if count != 1 else ''} up" if isinstance(count, int) else event["message"]
    return f"{what} in {duration(max(0.0, event['time'] - started_at))}"


def happenings(events: Sequence[dict], width: int, tidy: Tidy = str, shown: Optional[list] = None,
               max_lines: Optional[int] = MAX_ENTRY_LINES) -> list[str]:
    """Incidents (one line each) with their decision under them, and other events,
    each cut at ``max_lines`` (None: whole).

    The texts told go into ``shown`` so the end line need not repeat them.
    """
    shown = [] if shown is None else shown
    lines: list[str] = []
    last_incident = None
    for event in events:
        at = clock_text(event["time"])
        if event["type"] == "incident":
            last_incident = event["id"]
            description = incident_description(event)
            shown += [description, event["summary"]]
            text = f"{at}  {incident_where(event, tidy)}: {description}"
            lines += wrap(tidy(INDENT + text), width, EVENT_INDENT, max_lines)
            lines += [tidy(line) for line in last_output_lines(event, max_lines)]
            continue
        elif event["type"] == "decision":
            shown.append(event["reason"])
            if event["incident_id"] is not None and event["incident_id"] == last_incident:
                lines += wrap(tidy(f"{EVENT_INDENT}→ {event['action']} — {event['reason']}"), width,
                              EVENT_INDENT + "  ", max_lines)
                continue
            text = f"{at}  decision: {event['action']} — {event['reason']}"
        elif event["type"] == "event" and event["kind"] not in SHOWN_AS_FACTS:
            shown.append(event["message"])
            where = f" at step {event['step']}" if event["step"] is not None else ""
            text = f"{at}  {event['kind']}{where}: {event['message']}"
        else:
            continue
        lines += wrap(tidy(INDENT + text), width, EVENT_INDENT, max_lines)
    return lines


def last_output_lines(event: dict, max_lines: Optional[int] = MAX_ENTRY_LINES) -> list[str]:
    """The job's last lines an incident kept (evidence ``last_output``), under it: the last
    ``max_lines`` of them (None: all), each cut to the page's width by the reader's terminal."""
    outer = event.get("evidence")
    evidence = outer.get("evidence") if isinstance(outer, Mapping) else None
    kept = evidence.get("last_output") if isinstance(evidence, Mapping) else None
    if not isinstance(kept, list) or not kept:
        return []
    shown = kept if max_lines is None else kept[-max_lines:]
    more = f" (its last {len(shown)} of {len(kept)} kept lines; --full shows all)" if len(shown) < len(kept) else ""
    header = f"{EVENT_INDENT}last output of the job{more}:"
    return [header, *(f"{EVENT_INDENT}  | {line}" for line in shown)]


def incident_where(event: dict, tidy: Tidy = str) -> str:
    """``hang at step 23, ranks 0, 1, node 3f2a9c1e…``; the ranks (or nodes) are
    left out only when the description names every one of them: naming some
    would read as if only those were involved."""
    text = event["kind"] + (f" at step {event['step']}" if event["step"] is not None else "")
    described = tidy(incident_description(event))
    ranks = list(event["ranks"])
    if all(re.search(rf"\brank {r}\b", described) for r in ranks):
        ranks = []
    nodes = [tidy(str(n)) for n in event["nodes"]]
    if all(node in described for node in nodes):
        nodes = []
    who = ", ".join(filter(None, [listing("rank", ranks), listing("node", nodes)]))
    return text + (f", {who}" if who else "")


def incident_description(event: dict) -> str:
    """The detector's one-line description, without the kind and step the line already shows
    (and the weights whose local norm moved first, when the evidence names them)."""
    evidence = event.get("evidence")
    if isinstance(evidence, Mapping) and isinstance(evidence.get("description"), str):
        return evidence["description"] + _moved_first(evidence.get("evidence"))
    summary = event["summary"]
    for prefix in (f"{event['kind']} at step {event['step']}: ", f"{event['kind']}: "):
        if summary.startswith(prefix):
            return summary[len(prefix):]
    return summary


def _moved_first(evidence: object, names: int = 3) -> str:
    """``; local norms moved first at step 56: a 12.3x, b 8.1x`` from the evidence ``local_norms``."""
    norms = evidence.get("local_norms") if isinstance(evidence, Mapping) else None
    if not isinstance(norms, Mapping) or not norms.get("first"):
        return ""
    first = ", ".join(f"{w['name']} {w['ratio']:.1f}x" for w in norms["first"][:names])
    more = f" (+{len(norms['first']) - names})" if len(norms["first"]) > names else ""
    return f"; local norms moved first at step {norms['first_step']}: {first}{more}"


def ending(subrun: SubRun, shown: Sequence[str] = ()) -> str:
    """How the sub-run ended, or that no end is recorded.

    A reason that only repeats an incident or decision told above is left out.
    """
    if subrun.is_open:
        step = "" if subrun.last_step is None else f" (last step {subrun.last_step})"
        return f"no end recorded{step}: still running, or its driver died"
    at = clock_text(subrun.ended_at)
    if subrun.end_state == "finished":
        text = f"finished at step {subrun.last_step} ({at})"
    else:
        text = f"ended {at}: {subrun.end_state} at step {subrun.last_step}"
    reason = subrun.end_reason
    if reason and not _repeats(reason, shown) and reason != f"trained to step {subrun.last_step}":
        text += f" — {reason}"
    return text


def progress(metrics: Sequence[dict], recorded: Optional[int] = None) -> str:
    """Steps trained and how the loss moved, from this sub-run's metrics (or its
    first and last rows, with ``recorded`` the number of rows)."""
    first, last = metrics[0], metrics[-1]
    text = f"trained steps {first['step']}–{last['step']} ({len(metrics) if recorded is None else recorded} recorded)"
    if first["loss"] is not None and last["loss"] is not None:
        text += f", loss {first['loss']:.4g} → {last['loss']:.4g}"
    return text


def _repeats(reason: str, shown: Sequence[str]) -> bool:
    # The controller ends a restarting sub-run with "<action>: <incident summary>".
    return any(text and (reason == text or reason.endswith(": " + text)) for text in shown)


def _evidence(subrun: SubRun) -> Mapping[str, Any]:
    # Any JSON may have been recorded as evidence; only a mapping has fields to tell.
    return subrun.evidence if isinstance(subrun.evidence, Mapping) else {}


def _plan(subrun: SubRun) -> Mapping[str, Any]:
    return subrun.plan if isinstance(subrun.plan, Mapping) else {}


def _recorded_run_dir(subrun: SubRun) -> Optional[str]:
    run = subrun.config.get("run")
    return run.get("dir") if isinstance(run, Mapping) and isinstance(run.get("dir"), str) else None


def _body(text: str, width: int) -> list[str]:
    return wrap(INDENT + text, width, INDENT + "  ")
