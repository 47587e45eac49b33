"""The text of ``runmgr logbook compare``: the config diff, one row per step
(each metric's values, ``B - A``, the band and whether the step is outside it),
then the verdict of each metric and of the pair (its last line)."""

from __future__ import annotations

from typing import Optional, Sequence

from logbook.compare import MetricComparison
from logbook.compare_runs import RunComparison
from logbook.textfmt import value_text

MAX_ROWS = 60
"""A longer comparison prints this many rows, evenly spread, plus the steps around its verdict's step."""
AROUND = 2
"""Rows printed on each side of the verdict's step when rows are thinned."""
VALUE_CHARS = 40
"""A config value longer than this is cut in the diff (``--json`` has it whole)."""


def comparison_lines(result: RunComparison) -> list[str]:
    """Every line of the text, the verdict last."""
    lines = [_title(result), ""]
    lines += _diff_lines(f"config diff ({result.a} -> {result.b})", result.config_diff)
    if result.baseline is not None and result.baseline_config_diff is not None:
        lines += _diff_lines(f"baseline config diff ({result.baseline[0]} -> {result.baseline[1]})",
                             result.baseline_config_diff)
    lines += ["", *_table(result.metrics, result.verdict.step), ""]
    for metric in result.metrics:
        lines.append(f"{metric.metric}: {metric.verdict.text()} — {metric.verdict.why}")
    lines.append(f"verdict: {result.verdict.text()}")
    return lines


def _title(result: RunComparison) -> str:
    against = (f", band from the baseline pair {result.baseline[0]} / {result.baseline[1]}"
               if result.baseline else ", no baseline pair (no noise band)")
    return f"compare {result.b} against {result.a}{against}"


def _diff_lines(heading: str, diff: dict[str, list]) -> list[str]:
    if not diff:
        return [f"{heading}: none"]
    return [f"{heading}:"] + [f"  {key}: {value_text(old, VALUE_CHARS)} -> {value_text(new, VALUE_CHARS)}"
                              for key, (old, new) in diff.items()]


def _table(metrics: Sequence[MetricComparison], focus: Optional[int]) -> list[str]:
    """Header and rows: per metric A, B, B-A, band and a ``*`` where the step is outside the band."""
    header = f"{'step':>7}"
    for metric in metrics:
        name = metric.metric
        header += f" | {name + ' A':>13} {name + ' B':>13} {'B-A':>11} {'band':>10}  "
    rows = [header.rstrip()]
    cells = {m.metric: dict(zip(m.steps, zip(m.a, m.b, m.diff, m.band or [None] * len(m.steps), m.outside())))
             for m in metrics}
    all_steps = sorted(set().union(*(m.steps for m in metrics)))
    shown = shown_steps(all_steps, focus)
    previous = None
    for step in shown:
        if previous is not None and all_steps.index(step) != all_steps.index(previous) + 1:
            rows.append(f"{'…':>7}")
        row = f"{step:>7}"
        for metric in metrics:
            cell = cells[metric.metric].get(step)
            row += " | " + (_cell(*cell) if cell is not None else f"{'-':>13} {'-':>13} {'-':>11} {'-':>10}  ")
        rows.append(row.rstrip())
        previous = step
    return rows


def _cell(a: float, b: float, diff: float, width: Optional[float], out: bool) -> str:
    band = "-" if width is None else f"{width:.3g}"
    return f"{a:>13.7g} {b:>13.7g} {diff:>11.3g} {band:>10} {'*' if out else ' '}"


def shown_steps(steps: Sequence[int], focus: Optional[int], max_rows: int = MAX_ROWS) -> list[int]:
    """All steps when few; else ``max_rows`` spread evenly, the first and last, and
    :data:`AROUND` steps on each side of ``focus`` (the verdict's step)."""
    if len(steps) <= max_rows:
        return list(steps)
    stride = (len(steps) - 1) / (max_rows - 1)
    picked = {round(i * stride) for i in range(max_rows)}
    if focus is not None and focus in steps:
        at = steps.index(focus)
        picked |= set(range(max(0, at - AROUND), min(len(steps), at + AROUND + 1)))
    return [steps[i] for i in sorted(picked)]
