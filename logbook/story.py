"""A run's story, the part of its logbook that must read the same every time the same run is
told again (the demo's promise, issue 32 item 3): its sub-runs, in each the incidents that
were acted on with what was done, and how each sub-run ended.

What a machine's speed may move is left out: times; the step a sub-run had reached when it
was stopped, and so the checkpoint a plain restart resumes from; and the incidents decided
``ignore`` (a gradient spike that settles by itself, a straggler's strike, a slowdown): on a
loaded machine a rank slowed among slowed ranks, or the machine itself slowing, may or may not
be seen, and seeing it changes nothing the run does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

NOT_ACTED_ON = "ignore"
"""The decision that leaves the run as it is."""


@dataclass(frozen=True)
class Chapter:
    """One sub-run: what it was stopped for and how it ended."""

    subrun: str
    acted: tuple[str, ...] = ()
    """``"<incident kind> -> <action>"`` for each decision that acted, in the order decided."""
    end_state: Optional[str] = None


def story_of(events: Iterable[dict]) -> list[Chapter]:
    """The chapters of ``runmgr logbook events --json``'s rows (or ``Logbook.events()``), in order."""
    incidents: dict[int, str] = {}
    subruns: list[str] = []
    acted: dict[str, list[str]] = {}
    ends: dict[str, str] = {}
    for event in events:
        kind = event.get("type")
        if kind == "subrun_start":
            subruns.append(event["subrun"])
        elif kind == "incident":
            incidents[event["id"]] = event["kind"]
        elif kind == "decision" and event["action"] != NOT_ACTED_ON:
            incident = incidents.get(event.get("incident_id"), "?")
            acted.setdefault(event["subrun"], []).append(f"{incident} -> {event['action']}")
        elif kind == "subrun_end":
            ends[event["subrun"]] = event.get("end_state")
    return [Chapter(subrun, tuple(acted.get(subrun, ())), ends.get(subrun)) for subrun in subruns]


def story_lines(chapters: Iterable[Chapter]) -> list[str]:
    """One line per sub-run, as the bench and the tests print and compare them."""
    return [f"{c.subrun}: {'; '.join(c.acted) or 'nothing acted on'} ({c.end_state or 'running'})" for c in chapters]
