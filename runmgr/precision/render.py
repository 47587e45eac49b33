"""The check's report as text: the pinned protocol, the table (stage | A | B |
verdict), the first stage that differs, the weights involved and the band."""

from __future__ import annotations

from runmgr.precision.check import CheckReport

HEADER = ("stage", "A", "B", "verdict")


def _row(stage) -> tuple[str, str, str, str]:
    verdict = f"{stage.verdict} ({stage.detail})" if stage.detail else stage.verdict
    return (f"{stage.stage} ({stage.measure})", stage.a, stage.b, verdict)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return lines


def _dtypes(report: CheckReport) -> list[str]:
    if not report.dtypes_apart:
        return []
    return ["", "weights held in another dtype (the forward pass differs from step 1):",
            *(f"  {name}: {a} in A, {b} in B" for name, a, b in report.dtypes_apart)]


def _weights(report: CheckReport) -> list[str]:
    if not report.weights:
        return []
    rows = [("weight", "measure", "A", "B", "relative")]
    rows += [(w.name, f"step-1 {w.measure}", f"{w.a:.8g}", f"{w.b:.8g}", f"{w.relative:.2e}") for w in report.weights]
    return ["", "weights involved (step-1 local norm or step-1 update, the largest relative difference first):",
            *("  " + line for line in _table(rows))]


def render(report: CheckReport) -> str:
    """The text ``runmgr precision-check`` prints."""
    first = report.first_difference
    lines = [
        "precision check (case report 004's protocol, docs/precision_check.md): both sides pinned to " + " ".join(report.pinned) + ", the same seed",
        f"A: {report.a}",
        f"B: {report.b}",
        "",
        *_table([HEADER, *(_row(stage) for stage in report.stages)]),
        "",
        (f"first difference: {first.stage} ({first.measure})" if first is not None
         else "first difference: none (the two agree at every stage compared)"),
        *_dtypes(report),
        *_weights(report),
    ]
    if report.band_source:
        lines += ["", f"band: {report.band_source}"]
    return "\n".join(lines) + "\n"
