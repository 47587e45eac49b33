"""The Grafana dashboard is generated, not hand-written: the committed JSON is
what the builder makes now, and its queries name only metrics the exporter
serves (and each of them); docs/metrics.md lists every metric."""

from __future__ import annotations

import json
import re
from pathlib import Path

from runmgr.metrics import names
from runmgr.metrics.dashboard import DASHBOARD_PATH, main, render

ROOT = Path(__file__).resolve().parents[3]
METRIC_NAME = re.compile(r"\brunmgr_[a-z_]+\b")


def dashboard_queries(path: Path = DASHBOARD_PATH) -> list[str]:
    """Every panel's PromQL in a dashboard file (rows' nested panels included)."""
    dashboard = json.loads(path.read_text())
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_the_committed_dashboard_is_what_the_builder_makes_now():
    assert DASHBOARD_PATH == ROOT / "k8s" / "base" / "grafana" / "runmgr-dashboard.json"
    assert DASHBOARD_PATH.read_text() == render(), "run `python -m runmgr.metrics.dashboard` and commit the file"
    assert main(["--check"]) == 0


def test_check_says_when_the_file_is_out_of_date(tmp_path, capsys):
    stale = tmp_path / "dashboard.json"
    stale.write_text("{}\n")
    assert main(["--check", "--output", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--output", str(stale)]) == 0 and stale.read_text() == render()


def test_every_query_names_served_metrics_and_every_metric_has_a_panel():
    served = {spec.name for spec in names.ALL}
    queries = dashboard_queries()
    named = [set(METRIC_NAME.findall(expr)) for expr in queries]
    assert queries and all(found and found <= served for found in named), queries
    assert set().union(*named) == served


def test_the_docs_list_every_metric_with_its_type():
    table = (ROOT / "docs" / "metrics.md").read_text()
    for spec in names.ALL:
        assert re.search(rf"^\| `{spec.name}` \| {spec.type}\b", table, re.MULTILINE), spec.name
