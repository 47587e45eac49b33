"""The score of a labelled corpus for a terminal (and docs/detectors.md), and as JSON."""

from __future__ import annotations

import json
from typing import Optional

from runmgr.score.tally import IGNORE, Corpus, median


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[n]) for row in [header, *rows]) for n in range(len(header))]
    line = lambda cells: "  ".join(c.ljust(w) if n in (0, len(cells) - 1) else c.rjust(w)  # noqa: E731
                                   for n, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(header), *(line(row) for row in rows)]


def _number(value: Optional[float], digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _per_thousand(count: int, steps: int) -> str:
    return f"{1000 * count / steps:.2f}" if steps else "-"


def render_text(corpus: Corpus, heading: str) -> str:
    steps = sum(log.steps for log in corpus.logs)
    classes = corpus.classes()
    lines = [f"{heading}: {len(corpus.logs)} logs, {sum(r.labelled for r in classes)} labelled incidents, "
             f"{steps:,} iterations", ""]
    lines += _table(
        ["class", "logs", "labelled", "found", "missed", "delay steps", "delay s", "right decision", "decided"],
        [[r.cls, str(len(r.logs)), str(r.labelled), str(r.found), str(r.missed), _number(median(r.delays_steps)),
          _number(median(r.delays_s), 1), f"{r.right}/{r.labelled}",
          ", ".join(f"{action} x{count}" for action, count in sorted(r.actions.items()))] for r in classes])
    lines += ["", "false alarms (incidents no label explains; acted: its decision was not ignore):"]
    alarms = corpus.false_alarms()
    clean = corpus.clean_steps()
    clean_logs = sum(log.labels.clean for log in corpus.logs)
    if alarms:
        lines += _table(["kind", "all", "acted", "on clean runs", "acted, clean", "per 1,000 clean iterations"],
                        [[a.kind, str(a.all), str(a.acted), str(a.on_clean), str(a.acted_on_clean),
                          _per_thousand(a.on_clean, clean)] for a in alarms])
    else:
        lines.append("none")
    on_clean = sum(a.on_clean for a in alarms)
    acted_clean = sum(a.acted_on_clean for a in alarms)
    lines += ["", f"clean runs: {clean_logs} logs, {clean:,} iterations: {on_clean} false alarm(s) "
                  f"({_per_thousand(on_clean, clean)} per 1,000 iterations), {acted_clean} acted on "
                  f"({_per_thousand(acted_clean, clean)} per 1,000)"]
    lines += _details(corpus)
    return "\n".join(lines) + "\n"


def _details(corpus: Corpus) -> list[str]:
    """Every miss, wrong decision and false alarm, by log: what a person reads next."""
    out = []
    for log in corpus.logs:
        for outcome in log.outcomes:
            label = outcome.label
            where = f"  {log.log}: {label.cls} at step {label.step}"
            if outcome.found is None and not outcome.right:
                out.append(f"{where}: missed")
            elif not outcome.right:
                out.append(f"{where}: {outcome.action}, labelled {' or '.join(map(str, label.remedy))} "
                           f"({outcome.found.judgement.decision.reason[:160] if outcome.found else ''})")
        for call in log.false_alarms:
            incident = call.judgement.incident
            out.append(f"  {log.log}: false alarm {incident.summary()[:160]} -> {call.judgement.decision.action}")
    return ["", "misses, wrong decisions and false alarms:", *out] if out else []


def render_json(corpus: Corpus, heading: str) -> str:
    clean = corpus.clean_steps()
    return json.dumps({
        "heading": heading,
        "classes": [{"class": r.cls, "logs": sorted(r.logs), "labelled": r.labelled, "found": r.found,
                     "missed": r.missed, "right_decision": r.right, "median_delay_steps": median(r.delays_steps),
                     "median_delay_s": median(r.delays_s), "decided": r.actions} for r in corpus.classes()],
        "false_alarms": [vars(a) for a in corpus.false_alarms()],
        "clean_iterations": clean,
        "logs": [{"log": log.log, "about": log.labels.about, "flavor": str(log.labels.flavor),
                  "iterations": log.steps,
                  "outcomes": [{"class": o.label.cls, "step": o.label.step, "found": o.found is not None,
                                "action": o.action, "remedy": [str(a) for a in o.label.remedy], "right": o.right,
                                "delay_steps": o.delay_steps, "delay_s": o.delay_s,
                                "incident": o.found.judgement.incident.to_dict() if o.found else None}
                               for o in log.outcomes],
                  "false_alarms": [{"incident": c.judgement.incident.to_dict(),
                                    "action": str(c.judgement.decision.action), "acted": c.judgement.decision.action
                                    != IGNORE, "step": c.step} for c in log.false_alarms]}
                 for log in corpus.logs],
    }, indent=2, default=str) + "\n"
