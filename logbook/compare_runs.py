"""What ``runmgr logbook compare`` reads: each run's kept per-step loss and
grad norm and its config, from its logbook, then the judgement of
logbook/compare.py. The result is plain data (:meth:`RunComparison.to_dict`
is the ``--json`` output)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from logbook.compare import MetricComparison, Series, Verdict, common_steps, compare_metric, overall
from logbook.configdiff import config_diff
from logbook.errors import LogbookError
from logbook.store import Logbook

COMPARED = ("loss", "grad_norm")
"""The metrics compared step by step."""
LAYOUT = ("data_parallel_size",)
"""The plan's fields that change how a run trains without changing its config: in the diff as
``plan.<field>``, since a remedy's layout change is often what made two runs differ."""
RUN_IDENTITY = ("run.name", "run.dir")
"""Config keys that name the run itself: they differ between any two runs, so the diff leaves them out."""


@dataclass(frozen=True)
class RunSeries:
    """What one run contributes: its name, config and the kept lineage's series."""

    name: str
    config: dict
    """The config of its last sub-run (what it finished with, remedies included)."""
    series: dict[str, dict[int, float]]
    """metric -> step -> value (steps where the metric was recorded)."""
    layout: dict = field(default_factory=dict)
    """What the last sub-run's plan set that the config does not say: ``{"data_parallel_size": 1}``
    after a node was excluded without a spare (the config still asks for its world)."""


@dataclass(frozen=True)
class RunComparison:
    """Run B judged against run A, with the band of the baseline pair C, D when given."""

    a: str
    b: str
    baseline: Optional[tuple[str, str]]
    config_diff: dict[str, list]
    """``{"optim.weight_decay": [A's, B's]}``: the flattened keys that differ (less :data:`RUN_IDENTITY`)."""
    baseline_config_diff: Optional[dict[str, list]]
    """The same between C and D (what the baseline pair varied to get its noise)."""
    metrics: tuple[MetricComparison, ...]
    verdict: Verdict

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "baseline": list(self.baseline) if self.baseline else None,
                "config_diff": self.config_diff, "baseline_config_diff": self.baseline_config_diff,
                **self.verdict.to_dict(), "metrics": {m.metric: m.to_dict() for m in self.metrics}}


def read_run(run_dir: str | Path) -> RunSeries:
    """The kept series of :data:`COMPARED` and the last config of the run at ``run_dir``."""
    with Logbook.open(run_dir, create=False) as book:
        return run_series(book, Path(run_dir).resolve().name, f"the logbook at {run_dir}")


def run_series(book: Logbook, name: str, called: str) -> RunSeries:
    """What :func:`compare_runs` needs of one run, read through an open logbook; ``called``:
    how an error names it (``run 'a'``, ``the logbook at DIR``)."""
    with book.snapshot():
        lineage, rows = book.lineage(), book.kept_metrics()
    if not lineage:
        raise LogbookError(f"{called} has no sub-runs yet: nothing to compare")
    series: dict[str, dict[int, float]] = {metric: {} for metric in COMPARED}
    for row in rows:
        for metric in COMPARED:
            if row.get(metric) is not None:
                series[metric][int(row["step"])] = float(row[metric])
    layout = {key: lineage[-1].plan[key] for key in LAYOUT if lineage[-1].plan.get(key) is not None}
    return RunSeries(name, lineage[-1].config, series, layout)


def training_diff(a: RunSeries, b: RunSeries) -> dict[str, list]:
    """:func:`logbook.configdiff.config_diff` of the configs and layouts, less :data:`RUN_IDENTITY`."""
    with_layout = lambda run: {**run.config, **({"plan": run.layout} if run.layout else {})}  # noqa: E731
    return {key: values for key, values in config_diff(with_layout(a), with_layout(b)).items()
            if key not in RUN_IDENTITY}


def compare_runs(a: RunSeries, b: RunSeries, baseline: Optional[Sequence[RunSeries]] = None) -> RunComparison:
    """Judge B against A on every metric both recorded (against C, D's band when given)."""
    if baseline is not None and len(baseline) != 2:
        raise LogbookError(f"a baseline is a pair of runs (C and D), got {len(baseline)}")
    comparisons = []
    for metric in COMPARED:
        pair: Optional[tuple[Series, Series]] = (
            (baseline[0].series[metric], baseline[1].series[metric]) if baseline is not None else None)
        if common_steps(a.series[metric], b.series[metric], *(pair or ())):
            comparisons.append(compare_metric(metric, a.series[metric], b.series[metric], pair))
    if not comparisons:
        runs = ", ".join(r.name for r in (a, b, *(baseline or ())))
        raise LogbookError(f"{runs} share no recorded step of {' or '.join(COMPARED)}: nothing to compare "
                           "(did each run train at least one step?)")
    return RunComparison(
        a.name, b.name, (baseline[0].name, baseline[1].name) if baseline is not None else None,
        training_diff(a, b), training_diff(baseline[0], baseline[1]) if baseline is not None else None,
        tuple(comparisons), overall(comparisons))
