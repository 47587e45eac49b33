"""The Grafana dashboard of a run, built with grafana-foundation-sdk from the
metric names the exporter serves (runmgr/metrics/names.py), never written by
hand. The JSON is committed at k8s/base/grafana/runmgr-dashboard.json (the
Kubernetes overlays load it into Grafana through a ConfigMap); a test checks
the committed file is what this builder makes now, and another that every
panel's query returns data from a real Prometheus scraping a real run.

    python -m runmgr.metrics.dashboard          # rewrite the committed file
    python -m runmgr.metrics.dashboard --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grafana_foundation_sdk.builders.common import ReduceDataOptions
from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueTextMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from runmgr.metrics import names

DASHBOARD_PATH = Path(__file__).resolve().parents[2] / "k8s" / "base" / "grafana" / "runmgr-dashboard.json"
UID = "runmgr-run"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class PanelSpec:
    """One panel: a query over the exporter's metrics and how to show it."""

    title: str
    expr: str
    kind: Literal["timeseries", "stat"] = "timeseries"
    unit: str = "short"
    legend: str = ""
    description: str = ""


ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Run", (
        PanelSpec("Sub-run", names.SUBRUN.name, "stat", legend="{{subrun}}", description=names.SUBRUN.help),
        PanelSpec("State", f"{names.STATE.name} == 1", "stat", legend="{{runmgr_state}}",
                  description=names.STATE.help),
        PanelSpec("Step", names.STEP.name, "stat", description=names.STEP.help),
        PanelSpec("Progress", f"{names.STEP.name} / {names.TRAIN_ITERS.name}", "stat", unit="percentunit",
                  description="Steps reported / training.train_iters."),
        PanelSpec("ETTR", names.ETTR.name, "stat", unit="percentunit", description=names.ETTR.help),
        PanelSpec("Steps lost", names.LOST_STEPS.name, "stat", description=names.LOST_STEPS.help),
        PanelSpec("Time lost", names.LOST_SECONDS.name, "stat", unit="s", description=names.LOST_SECONDS.help),
    )),
    ("Training", (
        PanelSpec("Loss", names.LOSS.name, description=names.LOSS.help),
        PanelSpec("Gradient norm", names.GRAD_NORM.name, description=names.GRAD_NORM.help),
        PanelSpec("Learning rate", names.LEARNING_RATE.name, description=names.LEARNING_RATE.help),
        PanelSpec("Loss scale", names.LOSS_SCALE.name, description=names.LOSS_SCALE.help),
        PanelSpec("Tokens per second", names.TOKENS_PER_SECOND.name, description=names.TOKENS_PER_SECOND.help),
        PanelSpec("Step time", names.STEP_TIME.name, unit="s", description=names.STEP_TIME.help),
        PanelSpec("Step time (median of the last 50)", names.STEP_TIME_MEDIAN.name, unit="s",
                  description=names.STEP_TIME_MEDIAN.help),
        PanelSpec("Since the last step", f"time() - {names.LAST_STEP_AT.name}", "stat", unit="s",
                  description=names.LAST_STEP_AT.help + " The stall alert fires when this passes many step times."),
    )),
    ("Incidents and decisions", (
        PanelSpec("Incidents by kind", f"sum by (kind) ({names.INCIDENTS.name}) > 0", legend="{{kind}}",
                  description=names.INCIDENTS.help + " Kinds seen at least once."),
        PanelSpec("Decisions by action", f"sum by (action) ({names.DECISIONS.name}) > 0", legend="{{action}}",
                  description=names.DECISIONS.help + " Actions taken at least once."),
    )),
    ("Nodes and checkpoints", (
        PanelSpec("Nodes by health verdict", names.HEALTH_NODES.name, "stat", legend="{{verdict}}",
                  description=names.HEALTH_NODES.help),
        PanelSpec("Nodes avoided", names.EXCLUDED_NODES.name, "stat", description=names.EXCLUDED_NODES.help),
        PanelSpec("Last checkpoint", names.CHECKPOINT_STEP.name, "stat", description=names.CHECKPOINT_STEP.help),
        PanelSpec("Checkpoint intervals behind", f"({names.STEP.name} - {names.CHECKPOINT_STEP.name}) / "
                  f"{names.CHECKPOINT_INTERVAL.name}", "stat",
                  description="Steps since the last recorded checkpoint / steps between two checkpoints "
                              f"({names.CHECKPOINT_INTERVAL.name}): above 1 and growing, checkpoints are not landing."),
        PanelSpec("Checkpoint age", names.CHECKPOINT_AGE.name, unit="s", description=names.CHECKPOINT_AGE.help),
        PanelSpec("S3 upload lag", names.UPLOAD_LAG.name, unit="s", description=names.UPLOAD_LAG.help),
    )),
)
"""Every panel, row by row (the layout follows: stats four across, graphs two across)."""


def panels() -> list[PanelSpec]:
    return [panel for _, row in ROWS for panel in row]


def _panel(spec: PanelSpec, panel_id: int):
    builder = Stat() if spec.kind == "stat" else Timeseries()
    builder = (builder.id(panel_id).title(spec.title).description(spec.description).unit(spec.unit)
               .datasource(DATASOURCE)
               .span(6 if spec.kind == "stat" else 12).height(4 if spec.kind == "stat" else 8)
               .with_target(Dataquery().expr(spec.expr).legend_format(spec.legend).ref_id("A")
                            .datasource(DATASOURCE)))
    if spec.kind == "stat":
        builder = builder.reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        if spec.legend:  # the label says which (sub-run 1.03, state running, verdict admit)
            builder = builder.text_mode(BigValueTextMode.VALUE_AND_NAME)
    return builder


def build() -> Dashboard:
    """The dashboard builder, every panel's query naming a metric of names.ALL."""
    dashboard = (Dashboard("runmgr run").uid(UID).tags(["runmgr", "generated"]).refresh("10s")
                 .time("now-1h", "now").editable()
                 .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    panel_id = 0
    for title, row in ROWS:
        panel_id += 1
        dashboard = dashboard.with_row(Row(title).id(panel_id))
        for spec in row:
            panel_id += 1
            dashboard = dashboard.with_panel(_panel(spec, panel_id))
    return dashboard


def render() -> str:
    """The dashboard's JSON text, as committed (stable key order, final newline)."""
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runmgr.metrics.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is out of date")
    parser.add_argument("--output", type=Path, default=DASHBOARD_PATH, help="where the JSON goes")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.is_file() else ""
        if current != text:
            print(f"{args.output} is out of date: run `python -m runmgr.metrics.dashboard`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
