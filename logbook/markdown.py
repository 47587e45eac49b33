"""The chronicle as Markdown a team pastes into its notes: a summary table,
the cost of each incident class, the plots, then one section per sub-run
(why it started, what changed, where it started, how far it got, what it
cost, its incidents and decisions, its checkpoints, the commands it ran).

It says what ``runmgr logbook show`` says (the phrases come from
logbook/render.py and logbook/changes.py), laid out for a page instead of a
terminal. Every string the run recorded goes through logbook/mdtext.py, so
none of it becomes markup.
"""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Mapping, Optional, Sequence, get_args
from urllib.parse import quote

from logbook import mdtext as md
from logbook.accounting import SubRunCost
from logbook.errors import LogbookError
from logbook.report import ClassCost, run_report
from logbook.records import SubRun
from logbook.render import (RELAUNCH, changes_of, cost_text, ending, incident_description, incident_headline,
                            incident_where, progress, run_title, start_facts)
from logbook.store import Logbook
from logbook.textfmt import clock_text, duration, tidier

ExportFormat = Literal["md"]
"""What ``runmgr logbook export --format`` writes (Markdown only, for now)."""
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)

PLOTTED_METRICS = ("loss", "grad_norm", "lr", "loss_scale")
"""One PNG each beside the document, as ``runmgr logbook plot`` draws them."""
MAX_EVIDENCE_FIGURES = 8
"""Evidence figures shown after an incident (``runmgr logbook events --json`` has them all)."""
MAX_FIGURE_CHARS = 24
"""A text evidence value longer than this is no figure (a log line, a hint)."""
MAX_CHECKPOINTS_LISTED = 10
"""A sub-run with more checkpoints lists its first and last ones and counts the rest."""
OWN_LINES = ("workers_started", "checkpoint_rejected", "effective_settings", "command")
"""Events told in a sub-run's facts, its changes or its commands block, not in its list of happenings."""


def export_markdown(book: Logbook, out_path: str | Path) -> Path:
    """Write the run's chronicle to ``out_path`` with its plots in ``<stem>.plots/``
    beside it (when logbook.plot is there to draw them); returns the path written."""
    out = Path(out_path)
    if out.is_dir():
        raise LogbookError(f"--out {out} is a folder: name the Markdown file to write, e.g. {out / 'chronicle.md'}")
    if not out.parent.is_dir():
        raise LogbookError(f"no folder {out.parent} to write {out.name} in: create it first or pass another --out")
    plots = _write_plots(book, out.parent / f"{out.stem}.plots")
    links = [(path.stem, PurePosixPath(path.relative_to(out.parent)).as_posix()) for path in plots]
    out.write_text("\n".join(document(book, links)) + "\n", encoding="utf-8")
    return out


def document(book: Logbook, plot_links: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The Markdown lines of the whole chronicle; ``plot_links`` are (name, relative path) of images."""
    lineage, events = book.lineage(), book.events()
    costs, summary = book.costs(), book.summary()
    tidy = tidier([str(book.run_dir), *(_recorded_run_dir(subrun) for subrun in lineage)])
    lines = [f"# {md.text(run_title(lineage))}", "",
             f"Times are local (UTC{time.strftime('%z')}); paths are relative to the run directory.", ""]
    costs_by_class, mtbi_s, ettr_series = _report_figures(book)
    lines += summary_table(lineage, summary, mtbi_s) + ettr_line(ettr_series)
    lines += cost_table(costs_by_class)
    if plot_links:
        lines += ["", "## Plots"]
    for name, path in plot_links:
        lines += ["", f"![{md.text(name)}]({quote(path)})"]
    by_subrun: dict[str, list[dict]] = {}
    for event in events:
        by_subrun.setdefault(event["subrun"], []).append(event)
    metrics = _metrics_by_subrun(book)
    previous: Optional[SubRun] = None
    for subrun in lineage:
        lines += [""] + subrun_section(subrun, previous, by_subrun.get(subrun.id, []), metrics.get(subrun.id, []),
                                       costs.get(subrun.id), tidy)
        previous = subrun
    return lines


def summary_table(lineage: Sequence[SubRun], summary: Mapping[str, Any], mtbi_s: Optional[float] = None) -> list[str]:
    """Run-level figures as a two-column table; ``mtbi_s``: the mean time between
    incidents that ended a sub-run (no row when unknown)."""
    incidents = summary["incidents"]
    incident_text = str(sum(incidents.values()))
    if incidents:
        incident_text += ": " + ", ".join(f"{md.code(kind)} {n}" for kind, n in sorted(incidents.items()))
    ettr = "-"
    if summary["ettr"] is not None:
        ettr = (f"{summary['ettr']:.1%} (time on kept steps / wall time = {duration(summary['kept_time_s'])} / "
                f"{duration(summary['wall_time_s'])})")
    started = "-" if summary["started_at"] is None else clock_text(summary["started_at"], with_date=True)
    rows = [
        ("run", md.text(run_title(lineage))),
        ("state", md.text(_state(lineage))),
        ("started", started),
        ("wall time", duration(summary["wall_time_s"])),
        ("sub-runs", str(summary["subruns"])),
        ("steps kept", f"{summary['steps_kept']} (last step {summary['last_step']})"),
        ("steps lost", str(summary["steps_lost"])),
        ("ETTR", ettr),
        ("incidents", incident_text),
        ("checkpoints", str(summary["checkpoints"])),
    ]
    if mtbi_s is not None:
        rows.insert(rows.index(("incidents", incident_text)) + 1,
                    ("MTBI", f"{duration(mtbi_s)} (mean time between incidents that ended a sub-run)"))
    return ["## Summary", ""] + md.table(("figure", "value"), [(f"**{name}**", value) for name, value in rows])


def ettr_line(series: Sequence[tuple[float, float]]) -> list[str]:
    """ETTR as it went, one point per sub-run end (none when there is no series to tell)."""
    if len(series) < 2:
        return []
    points = ", ".join(f"{clock_text(at)} {ettr:.1%}" for at, ettr in series)
    return ["", f"ETTR over time (at each sub-run's end): {points}"]


def cost_table(costs: Sequence[Any]) -> list[str]:
    """What each incident class cost: rows shaped like logbook.report.ClassCost."""
    if not costs:
        return ["", "## Cost by incident class", "", "No incident cost the run anything."]
    header = ("incident class", "incidents", "restarts", "steps lost", "training redone", "down time",
              "restart time", "wall time lost")
    rows = [(md.code(c.kind), str(c.incidents), str(c.restarts), str(c.steps_lost), duration(c.redone_s),
             duration(c.downtime_s), duration(c.restart_s), duration(c.wall_lost_s)) for c in costs]
    return ["", "## Cost by incident class", ""] + md.table(header, rows, align="lrrrrrrr")


def subrun_section(subrun: SubRun, previous: Optional[SubRun], events: Sequence[dict], metrics: Sequence[dict],
                   cost: Optional[SubRunCost], tidy=str) -> list[str]:
    """``## 12.03 — 2026-11-23 08:40 — from step 40`` and what there is to say about it."""
    lines = [f"## {md.text(subrun.id)} — {clock_text(subrun.started_at, with_date=True)} — {_origin(subrun)}", ""]
    lines += _item("Why it started", md.text(tidy(why_text(subrun))), _why_details(subrun, tidy))
    changes = [md.text(tidy(change)) for change in changes_of(subrun, previous)]
    in_force = [md.text(tidy(e["message"])) for e in events if e["type"] == "event" and e["kind"] == "effective_settings"]
    lines += _item("What changed", "; ".join(changes) or "nothing in the config or the plan", in_force)
    lines += _item("Where it started", _where(subrun, tidy), [md.text(tidy(fact)) for fact in start_facts(subrun, events)])
    shown: list[str] = []
    happened = happenings(events, tidy, shown)
    trained = progress(metrics) if metrics else "no step trained"
    lines += _item("How far it got", md.text(tidy(f"{trained}; {ending(subrun, shown)}")))
    if cost is not None and (cost.lost_steps or cost.downtime):
        lines += _item("What it cost", md.text(cost_text(cost)))
    lines += _checkpoints([e for e in events if e["type"] == "checkpoint"], tidy)
    if happened:
        lines += ["", "Incidents and decisions:", ""] + happened
    commands = [e for e in events if e["type"] == "event" and e["kind"] == "command"]
    if commands:
        lines += ["", "Commands:", ""] + md.fenced(command_lines(commands), "sh")
    return lines


def why_text(subrun: SubRun) -> str:
    """The incident that started the sub-run (kind, step, the detector's description; its
    culprits when the description has none), or how the sub-run was launched."""
    incident = _evidence(subrun).get("incident")
    if isinstance(incident, Mapping) and incident.get("kind"):
        description = incident.get("description")
        if not isinstance(description, str) or not description:
            return incident_headline(incident)
        at = f" at step {incident['onset_step']}" if incident.get("onset_step") is not None else ""
        return f"{incident['kind']}{at}: {description}"
    if subrun.cause == "launch":
        return "first launch"
    if subrun.cause.startswith(RELAUNCH):
        return f"relaunch ({subrun.cause[len(RELAUNCH):]})"
    return subrun.cause


def evidence_figures(incident: Mapping[str, Any]) -> str:
    """``baseline 2.7, peak 9.1, z 14.2``: the scalar evidence of an incident."""
    evidence = incident.get("evidence")
    if not isinstance(evidence, Mapping):
        return ""
    figures = [f"{key} {_figure(value)}" for key, value in evidence.items() if _figure(value)]
    return ", ".join(figures[:MAX_EVIDENCE_FIGURES]) + (", …" if len(figures) > MAX_EVIDENCE_FIGURES else "")


def happenings(events: Sequence[dict], tidy=str, shown: Optional[list] = None) -> list[str]:
    """Incidents with their decision under them, and the other events, as a Markdown list;
    the texts told go into ``shown`` so the end line need not repeat them."""
    shown = [] if shown is None else shown
    lines: list[str] = []
    last_incident = None
    for event in events:
        at = clock_text(event["time"])
        if event["type"] == "incident":
            last_incident = event["id"]
            description = incident_description(event)
            shown += [description, event["summary"]]
            lines.append(f"- {at} — {md.text(tidy(incident_where(event, tidy)))}: {md.text(tidy(description))}")
        elif event["type"] == "decision":
            shown.append(event["reason"])
            decided = f"**{md.text(event['action'])}** — {md.text(tidy(event['reason']))}"
            if event["incident_id"] is not None and event["incident_id"] == last_incident:
                lines.append(f"  - → {decided}")
            else:
                lines.append(f"- {at} — decision: {decided}")
        elif event["type"] == "event" and event["kind"] not in OWN_LINES:
            shown.append(event["message"])
            where = f" at step {event['step']}" if event["step"] is not None else ""
            lines.append(f"- {at} — {md.text(event['kind'])}{where}: {md.text(tidy(event['message']))}")
    return lines


def command_lines(commands: Sequence[dict]) -> list[str]:
    """Each recorded command as a shell line under a ``# node N`` comment, verbatim
    (shortening an id or a path would make it one that cannot be pasted)."""
    lines = []
    for event in commands:
        node, sep, command = event["message"].partition(": ")
        if sep and node.startswith("node "):
            lines += [f"# {node}", *command.splitlines()]
        else:
            lines += event["message"].splitlines()
    return lines


def _figure(value: Any) -> str:
    """A number to 4 significant digits, or a short word; anything longer (a log line,
    a hint) is left to ``runmgr logbook events --json``."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return str(value)
    return value if isinstance(value, str) and 0 < len(value) <= MAX_FIGURE_CHARS else ""


def _why_details(subrun: SubRun, tidy) -> list[str]:
    evidence = _evidence(subrun)
    details = []
    incident = evidence.get("incident")
    figures = evidence_figures(incident) if isinstance(incident, Mapping) else ""
    if figures:
        details.append("evidence: " + md.text(tidy(figures)))
    decision = evidence.get("decision")
    if isinstance(decision, Mapping) and decision.get("action"):
        details.append(f"decision: **{md.text(decision['action'])}** — {md.text(tidy(str(decision.get('reason', ''))))}")
    return details


def _where(subrun: SubRun, tidy) -> str:
    if is_warm(subrun):
        return f"warm restart from the ranks' memory (step {subrun.start_step})"
    if subrun.start_checkpoint:
        return f"checkpoint {md.code(tidy(subrun.start_checkpoint))} (step {subrun.start_step})"
    return "from scratch (no checkpoint)" if subrun.start_step == 0 else f"step {subrun.start_step}, no checkpoint"


def is_warm(subrun: SubRun) -> bool:
    """A sub-run whose survivors went on from memory and whose lost ranks restored from a peer's."""
    return isinstance(subrun.evidence, Mapping) and subrun.evidence.get("restart") == "warm"


def _origin(subrun: SubRun) -> str:
    return "from scratch" if subrun.start_step == 0 and not subrun.start_checkpoint else f"from step {subrun.start_step}"


def _checkpoints(checkpoints: Sequence[dict], tidy) -> list[str]:
    if not checkpoints:
        return []
    listed = [f"step {c['step']} ({md.code(tidy(c['path']))})" for c in checkpoints]
    if len(listed) > MAX_CHECKPOINTS_LISTED:
        half = MAX_CHECKPOINTS_LISTED // 2
        listed = listed[:half] + [f"… {len(listed) - 2 * half} more …"] + listed[-half:]
    return _item(f"Checkpoints ({len(checkpoints)})", ", ".join(listed))


def _item(label: str, body: str, details: Sequence[str] = ()) -> list[str]:
    return [f"- **{label}:** {body}", *(f"  - {detail}" for detail in details)]


def _state(lineage: Sequence[SubRun]) -> str:
    if not lineage:
        return "no sub-runs yet"
    last = lineage[-1]
    return last.end_state or "running (or its driver died: no end recorded)"


def _metrics_by_subrun(book: Logbook) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for row in book.all_metrics():
        grouped.setdefault(row["subrun"], []).append(row)
    return grouped


def _evidence(subrun: SubRun) -> Mapping[str, Any]:
    return subrun.evidence if isinstance(subrun.evidence, Mapping) else {}


def _recorded_run_dir(subrun: SubRun) -> Optional[str]:
    run = subrun.config.get("run")
    return run.get("dir") if isinstance(run, Mapping) and isinstance(run.get("dir"), str) else None


def _report_figures(book: Logbook) -> tuple[Sequence[ClassCost], Optional[float], Sequence[tuple[float, float]]]:
    """(cost by incident class, MTBI, ETTR series), from the run report."""
    report = run_report(book)
    return report.costs, report.mtbi_s, report.ettr_series


def _write_plots(book: Logbook, out_dir: Path) -> list[Path]:
    """One PNG per plotted metric in ``out_dir``."""
    from logbook.plot import write_png  # numpy and matplotlib: only when a document is written

    out_dir.mkdir(exist_ok=True)
    return [write_png(book, [metric], out_dir / f"{metric}.png") for metric in PLOTTED_METRICS]
