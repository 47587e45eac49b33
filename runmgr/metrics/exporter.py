"""The run's metrics for Prometheus, as an observer of the controller.

What the trainer reports (step, loss, grad norm, LR, loss scale, tokens/s)
and what the controller is doing (sub-run, state, nodes avoided, the launch's
health verdicts) are kept from the transitions and polls the observer sees:
the very reports the logbook writer records. What the logbook computes over
the lineage (ETTR, lost steps and seconds, incidents and decisions, the
checkpoints and their uploads) is read from the logbook at each scrape, with
logbook/accounting.py's own functions, so Prometheus and
``runmgr logbook show`` never disagree, a relaunch included.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, StateSetMetricFamily
from prometheus_client.samples import Sample

from logbook import Logbook, parse_subrun_id
from runmgr.choices import Action, IncidentKind
from runmgr.controller.group import GroupPoll
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Launching, Running, State
from runmgr.metrics import names
from runmgr.metrics.names import MetricSpec
from runmgr.metrics.uploads import upload_lag
from runmgr.observers.logbook_writer import metric_row
from runmgr.observers.status_file import STATE_NAMES

STATES = tuple(STATE_NAMES.values())
VERDICTS = ("admit", "warn", "exclude", "unchecked")
"""The health gate's verdicts (health/fleet.py), and ``unchecked`` for nodes a
launch with ``health.skip=true`` admitted without probing."""

REPORTED: dict[MetricSpec, str] = {
    names.STEP: "step", names.LOSS: "loss", names.GRAD_NORM: "grad_norm", names.LEARNING_RATE: "lr",
    names.LOSS_SCALE: "loss_scale", names.TOKENS_PER_SECOND: "tokens_per_s", names.STEP_TIME: "step_time",
}
"""Metric -> the field of the logbook's metrics row (logbook_writer.metric_row) it serves."""
STEP_TIME_WINDOW = 50
"""Reported steps the median step time is taken over: enough that one slow step (a checkpoint's,
an evaluation's) does not move it, few enough that it follows a change of pace within minutes."""


@dataclass(frozen=True)
class Live:
    """What the controller told the observer last; replaced whole, so a scrape
    (another thread) never sees half an update."""

    train_iters: int
    state: str = "launching"
    subrun: str | None = None
    row: Mapping[str, float] = field(default_factory=dict)
    """The last step's metrics row, as the logbook records it."""
    excluded_nodes: int = 0
    health: Mapping[str, int] = field(default_factory=dict)
    stepped_at: float | None = None
    """When the last step report arrived (the observer's clock)."""
    step_times: tuple[float, ...] = ()
    """Rank 0's step times of the last :data:`STEP_TIME_WINDOW` reported steps."""


def health_verdicts(health: Mapping) -> dict[str, int]:
    """Nodes by verdict from the health gate's evidence (runmgr/healthcheck/gate.py):
    a check's own counts, or, when the probes were skipped, the nodes the last
    check excluded and the rest unchecked."""
    summary = health.get("summary") or {}
    counts = {verdict: int(summary.get(verdict, 0)) for verdict in VERDICTS}
    if health.get("skipped"):
        counts["unchecked"] = max(0, int(summary.get("nodes", 0)) - counts["exclude"])
    return counts


class MetricsObserver:
    """Keeps the live figures from the controller's transitions and polls; a
    Prometheus collector (registered in the run's own registry) serves them with
    the logbook's figures. ``mirrored``: the run mirrors checkpoints to S3 (else
    the upload lag is NaN). ``run``: the run's name, a ``run`` label on every sample, so that two
    runs scraped into one Prometheus (or one dashboard) never collide."""

    def __init__(self, book: Logbook, train_iters: int, mirrored: bool = False,
                 clock: Callable[[], float] = time.time, save_interval: int | None = None,
                 run: str | None = None) -> None:
        """``save_interval``: steps between two checkpoints (None: none on a schedule)."""
        self.book = book
        self.run = run
        self.mirrored = mirrored
        self.save_interval = save_interval
        self.clock = clock
        self.live = Live(train_iters)

    # ---- the controller's side ------------------------------------------

    def on_transition(self, old: State | None, new: State) -> None:
        live = replace(self.live, state=STATE_NAMES[type(new)], subrun=new.subrun)
        if isinstance(new, Launching):
            live = replace(live, excluded_nodes=len(new.plan.avoid_nodes))
            if "health" in new.evidence:  # the launch's gate; restarts keep its verdicts
                live = replace(live, health=health_verdicts(new.evidence["health"]))
        self.live = live

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        # A poll is of the state the run is in (a shadow follower's sub-run starts as launching and
        # only ever polls: its ranks are the followed job's).
        self.live = replace(self.live, state=STATE_NAMES.get(type(state), self.live.state))
        if poll.steps:
            times = [float(step.step_time) for step in poll.steps if step.step_time is not None]
            self.live = replace(self.live, row=metric_row(poll.steps[-1]), stepped_at=self.clock(),
                                step_times=(self.live.step_times + tuple(times))[-STEP_TIME_WINDOW:])

    def on_judgement(self, state: Running | Launching, judgement: Judgement) -> None:
        """Incidents and decisions are served from the logbook, which records each judgement."""

    # ---- Prometheus' side (its HTTP thread) ----------------------------------

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry then asks :meth:`collect` only when scraped."""
        return []

    def collect(self) -> Iterator[Metric]:
        live = self.live
        families = [*self._reported(live), *self._controller(live),
                    *self._from_logbook(self.book.live_figures(names.MIRRORED_EVENTS))]
        for family in families:
            if self.run is not None:
                family.samples = [Sample(sample.name, {names.RUN_LABEL: self.run, **sample.labels}, *sample[2:])
                                  for sample in family.samples]
            yield family

    def _reported(self, live: Live) -> Iterator[Metric]:
        for spec, key in REPORTED.items():
            if key in live.row:
                yield GaugeMetricFamily(spec.name, spec.help, value=live.row[key])
        if live.stepped_at is not None:
            yield GaugeMetricFamily(names.LAST_STEP_AT.name, names.LAST_STEP_AT.help, value=live.stepped_at)
        if live.step_times:
            yield GaugeMetricFamily(names.STEP_TIME_MEDIAN.name, names.STEP_TIME_MEDIAN.help,
                                    value=statistics.median(live.step_times))
        yield GaugeMetricFamily(names.TRAIN_ITERS.name, names.TRAIN_ITERS.help, value=live.train_iters)
        if self.save_interval:
            yield GaugeMetricFamily(names.CHECKPOINT_INTERVAL.name, names.CHECKPOINT_INTERVAL.help,
                                    value=self.save_interval)

    def _controller(self, live: Live) -> Iterator[Metric]:
        if live.subrun is not None:
            subrun = GaugeMetricFamily(names.SUBRUN.name, names.SUBRUN.help, labels=names.SUBRUN.labels)
            subrun.add_metric([live.subrun], parse_subrun_id(live.subrun)[1])
            yield subrun
        yield StateSetMetricFamily(names.STATE.name, names.STATE.help,
                                   value={state: state == live.state for state in STATES})
        yield GaugeMetricFamily(names.EXCLUDED_NODES.name, names.EXCLUDED_NODES.help, value=live.excluded_nodes)
        if live.health:
            yield _labelled(GaugeMetricFamily, names.HEALTH_NODES, live.health)

    def _from_logbook(self, figures: dict) -> Iterator[Metric]:
        summary = figures["summary"]
        ettr = summary["ettr"]
        yield GaugeMetricFamily(names.ETTR.name, names.ETTR.help, value=math.nan if ettr is None else ettr)
        yield CounterMetricFamily(names.LOST_STEPS.name, names.LOST_STEPS.help, value=summary["steps_lost"])
        yield GaugeMetricFamily(names.LOST_SECONDS.name, names.LOST_SECONDS.help, value=summary["lost_time_s"])
        # Every known kind and action from 0, so that the first of each is an increase Prometheus sees.
        yield _labelled(CounterMetricFamily, names.INCIDENTS,
                        {**dict.fromkeys((kind.value for kind in IncidentKind), 0), **summary["incidents"]})
        yield _labelled(CounterMetricFamily, names.DECISIONS,
                        {**dict.fromkeys((action.value for action in Action), 0), **Counter(figures["decisions"])})
        checkpoints = figures["checkpoints"]
        if checkpoints:
            _, step, recorded_at = checkpoints[-1]
            yield GaugeMetricFamily(names.CHECKPOINT_STEP.name, names.CHECKPOINT_STEP.help, value=step)
            yield GaugeMetricFamily(names.CHECKPOINT_AGE.name, names.CHECKPOINT_AGE.help,
                                    value=max(0.0, self.clock() - recorded_at))
        lag = upload_lag(checkpoints, figures["events"], self.clock()) if self.mirrored else math.nan
        yield GaugeMetricFamily(names.UPLOAD_LAG.name, names.UPLOAD_LAG.help, value=lag)


def _labelled(family: type, spec: MetricSpec, values: Mapping[str, float]) -> Metric:
    metric = family(spec.name, spec.help, labels=spec.labels)
    for label, value in sorted(values.items()):
        metric.add_metric([label], value)
    return metric
