"""``runmgr logbook norms RUN --step N``: which weights' gradient norms moved first and most
around a step, as text (or JSON), from the logbook's ``local_norms`` table.

The steps around N may have been trained more than once (a rollback redoes them):
the norms are read as one sub-run saw its history (logbook/norms_queries.py), by
default the sub-run in which an incident at step N was seen, else the newest sub-run
that trained step N (not a later one that resumed past it).
"""

from __future__ import annotations

import json
import math
from typing import Optional, TextIO

from logbook import norms_queries
from logbook.errors import LogbookError
from logbook.local_norms import DEFAULT_THRESHOLD, NormMoves, analyse
from logbook.store import Logbook

NAME_WIDTH = 36


def norms(run_dir, step: int, out: TextIO, threshold: float = DEFAULT_THRESHOLD, as_json: bool = False,
          subrun: Optional[str] = None) -> int:
    """Print the weights whose norm moved first and most from ``step`` on."""
    if step < 1:
        raise LogbookError(f"--step must be a step of the run (1 or more), got {step}")
    if not (math.isfinite(threshold) and threshold > 1.0):
        raise LogbookError(f"--threshold is a ratio to the baseline and must be above 1, got {threshold:g}")
    with Logbook.open(run_dir, create=False) as book:
        with book.snapshot():
            lineage, events = book.lineage(), book.events()
            rows = book.query(norms_queries.fetch_local_norms)
    if not rows:
        raise LogbookError(f"no local norms in the logbook of {run_dir}: the trainer records them every "
                           f"training.local_norms_interval steps and after a rollback (docs/local_norms.md)")
    chosen, why = _subrun_of(step, lineage, events, subrun)
    series = norms_queries.branch_series(lineage, rows, chosen)
    moves = analyse(series, step, threshold)
    if moves is None:
        recorded = sorted(series)
        raise LogbookError(f"sub-run {chosen} recorded no local norms both before and at or after step {step} "
                           f"(recorded steps {recorded[0]}-{recorded[-1]}, {len(recorded)} of them): pick a "
                           f"step inside that range")
    if as_json:
        out.write(json.dumps({"subrun": chosen, **moves.to_dict()}) + "\n")
    else:
        out.write("\n".join(norms_text(moves, chosen, why)) + "\n")
    return 0


def _subrun_of(step: int, lineage, events: list[dict], asked: Optional[str]) -> tuple[str, str]:
    """The sub-run whose history is read, and why that one."""
    if asked is not None:
        return asked, "as asked"
    seen = [e for e in events if e["type"] == "incident" and e.get("step") == step]
    if seen:
        return seen[-1]["subrun"], f"the {seen[-1]['kind']} at step {step} was seen there"
    if not lineage:
        raise LogbookError("no sub-runs in this logbook")
    # The newest sub-run that trained step N: a later one that resumed past N never saw it.
    trained = next((sub for sub in reversed(lineage) if sub.start_step < step), lineage[0])
    return trained.id, f"the newest sub-run that trained step {step}, from step {trained.start_step}; --subrun reads another"


def _ratio(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.1f}x"


def norms_text(moves: NormMoves, subrun: str, why: str) -> list[str]:
    """The lines ``runmgr logbook norms`` prints."""
    base, seen = moves.baseline_steps, moves.examined_steps
    lines = [f"local norms around step {moves.step}, as sub-run {subrun} saw them ({why})",
             f"baseline: each weight's median over steps {base[0]}-{base[-1]} ({len(base)} recorded); "
             f"examined: steps {seen[0]}-{seen[-1]}; threshold {moves.threshold:g}x"]
    if moves.first_step is None:
        lines.append(f"no weight's norm rose above {moves.threshold:g}x its baseline")
    else:
        first = ", ".join(f"{w.name} {_ratio(w.first_ratio)}" for w in moves.first)
        lines.append(f"moved first, at step {moves.first_step}: {first}")
    top = moves.most[0]
    lines.append(f"moved most: {top.name} {_ratio(top.peak_ratio)} at step {top.peak_step}")
    lines.append("")
    lines.append(f"{'weight':<{NAME_WIDTH}} {'baseline':>10} {'first':>6} {'ratio':>8} {'peak':>6} {'ratio':>8}")
    for w in moves.most:
        first = "-" if w.first_step is None else str(w.first_step)
        lines.append(f"{w.name:<{NAME_WIDTH}} {w.baseline:>10.3g} {first:>6} {_ratio(w.first_ratio):>8} "
                     f"{w.peak_step:>6} {_ratio(w.peak_ratio):>8}")
    return lines
