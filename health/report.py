"""Reports: the fleet report as a JSON-able dict (what ``health-check`` writes
and ``launch`` reads back for its exclusion list) and a plain-text table that
reads well in 100 columns."""

from __future__ import annotations

import textwrap
from typing import Mapping, Optional, Sequence

from health.fleet import Verdict, figure_name
from health.node import NodeReport

REPORT_VERSION = 1
_NODE_MAX, _VERDICT_W, _FIGURES_MAX, _REASON_MIN = 28, 8, 30, 30


def fleet_report(reports: Sequence[NodeReport], verdicts: Sequence[Verdict],
                 generated_at: float) -> dict:
    """The whole check as plain data: summary, exclusion list, every node in full."""
    by_node = {r.node: r for r in reports}
    counts = {kind: sum(v.verdict == kind for v in verdicts)
              for kind in ("admit", "warn", "exclude")}
    return {
        "version": REPORT_VERSION,
        "generated_at": generated_at,
        "summary": {"nodes": len(verdicts), **counts},
        "excluded": {v.node: list(v.reasons) for v in verdicts if v.verdict == "exclude"},
        "nodes": [{**v.to_dict(), "report": by_node[v.node].to_dict()}
                  for v in verdicts if v.node in by_node],
    }


def excluded_nodes(report: Mapping) -> list[str]:
    """The nodes a fleet report excludes (what ``launch`` honours)."""
    return sorted(report.get("excluded", {}))


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def key_figures(figures: Mapping[str, float]) -> str:
    """The few figures a person scans for: matmul, memory, worst storage write."""
    parts = []
    if "compute.matmul_tflops" in figures:
        parts.append(f"{_number(figures['compute.matmul_tflops'])} TF/s")
    if "compute.memory_gbps" in figures:
        parts.append(f"{_number(figures['compute.memory_gbps'])} GB/s")
    writes = [v for k, v in figures.items() if figure_name(k) == "storage.write_mbps"]
    if writes:
        parts.append(f"w {_number(min(writes))} MB/s")
    return " ".join(parts) or "-"


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def render_table(verdicts: Sequence[Verdict], reports: Sequence[NodeReport],
                 width: int = 100, title: Optional[str] = None) -> str:
    """One block per node: name, verdict, key figures, then reasons wrapped to ``width``."""
    by_node = {r.node: r for r in reports}
    figures = {v.node: key_figures(by_node[v.node].figures) if v.node in by_node else "-"
               for v in verdicts}
    node_w = min(_NODE_MAX, max([len("NODE")] + [len(v.node) for v in verdicts]))
    figures_w = min(_FIGURES_MAX, max([len("KEY FIGURES")] + [len(f) for f in figures.values()]))
    reason_w = max(_REASON_MIN, width - node_w - _VERDICT_W - figures_w - 3)
    indent = " " * (node_w + _VERDICT_W + figures_w + 3)
    lines = [title] if title else []
    lines += [f"{'NODE':<{node_w}} {'VERDICT':<{_VERDICT_W}} {'KEY FIGURES':<{figures_w}} REASONS",
              "-" * min(width, len(indent) + reason_w)]
    for verdict in verdicts:
        notes = list(verdict.reasons) + [f"(warn) {w}" for w in verdict.warnings]
        body = [line for note in notes
                for line in textwrap.wrap(note, reason_w, subsequent_indent="  ",
                                           break_on_hyphens=False)] or ["-"]
        lines.append(f"{_cell(verdict.node, node_w):<{node_w}} "
                     f"{verdict.verdict.upper():<{_VERDICT_W}} "
                     f"{_cell(figures[verdict.node], figures_w):<{figures_w}} {body[0]}")
        lines += [indent + line for line in body[1:]]
    summary = {k: sum(v.verdict == k for v in verdicts) for k in ("admit", "warn", "exclude")}
    lines.append(f"{len(verdicts)} nodes: {summary['admit']} admitted, {summary['warn']} "
                 f"admitted with warnings, {summary['exclude']} excluded")
    return "\n".join(lines)
