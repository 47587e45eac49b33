"""What the page's curves, incidents and overlay say, over HTTP through the
real server (issue 32 item 5): every incident kind is placed, the sub-runs
have the PNG's colours, the x axis can be wall-clock or tokens, an incident
reads as a table, two runs overlay, and bad input gets one clear line."""

from __future__ import annotations

import json
import time
from html import unescape

import pytest

from logbook.plot import figures_data
from logbook.web.readonly import open_read_only
from tests.logbook.conftest import T0
from tests.logbook.web.conftest import NODE
from tests.logbook.web.test_app import fetch

STEPLESS = {"worker_death", "device_fault", "launch_failure", "early_exit", "storage_outage", "hang"}
"""Kinds run5 records without a step (conftest.write_every_kind: 4 kinds to a sub-run of 10 steps)."""


def curves(server_url: str, run: str, query: str = "") -> dict:
    status, _, body = fetch(f"{server_url}/api/run/{run}/curves?{query}")
    assert status == 200, body
    return json.loads(body)


def test_every_incident_kind_is_drawn_those_without_a_step_where_their_subrun_stopped(server_url, runs_folder):
    marks = curves(server_url, "run5")["sources"]["incidents"]
    assert sorted(marks["kind"]) == sorted(runs_folder.kind_ids)  # worker_death and device_fault included
    stopped = {"5.00": 10, "5.01": 20, "5.02": 30}
    for kind, x, subrun, step in zip(marks["kind"], marks["x"], marks["subrun"], marks["step"]):
        if kind in STEPLESS:
            assert (x, step) == (stopped[subrun], f"{stopped[subrun]} (where the sub-run stopped)")
        else:
            assert x == stopped[subrun] - 5
    hover = dict(zip(marks["kind"], marks["decision"]))
    assert hover["device_fault"] == "restart: device_fault: restart from the last checkpoint"


def test_subruns_have_the_colours_of_the_png(server_url, runs_folder):
    from logbook.plot_png import build_figure

    with open_read_only(runs_folder.root / "run12") as book:
        png = build_figure(figures_data(book, ["loss"]))
    # Each line the PNG draws, by the steps it spans: its colour.
    png_colours = {(int(line.get_xdata()[0]), int(line.get_xdata()[-1])): line.get_color()
                   for ax in png.axes for line in ax.get_lines() if len(line.get_xdata()) > 1}
    page = curves(server_url, "run12", "metrics=loss")
    compared = 0
    for state in ("kept", "lost"):
        source = page["sources"][f"{state}-loss"]
        for xs, colour, subrun in zip(source["xs"], source["colour"], source["subrun"]):
            assert png_colours[(xs[0], xs[-1])] == colour == page["colours"][subrun]
            compared += 1
    assert compared == 5 and len(set(page["colours"].values())) == 3


def test_the_x_axis_can_be_wall_clock_or_tokens(server_url):
    by_time = curves(server_url, "run12", "x=wall&metrics=loss")
    assert by_time["x_label"] == "wall-clock (local time)"
    first = by_time["sources"]["kept-loss"]["xs"][0][0]
    step_1 = T0 + 1 / 3.0  # the trainer's time of step 1
    # In ms, shifted by this machine's UTC offset: bokeh prints a datetime as UTC, the page then reads local time.
    assert first == (step_1 + time.localtime(step_1).tm_gmtoff) * 1000
    by_tokens = curves(server_url, "run12", "x=tokens&metrics=loss")
    kept = dict(zip(by_tokens["sources"]["kept-loss"]["subrun"], by_tokens["sources"]["kept-loss"]["xs"]))
    # Each step trains 4096 tokens; 12.02 resumed at step 40, so its step 41 is the 41st step's worth.
    assert kept["12.00"][0] == 4096 and kept["12.02"][0] == 41 * 4096
    assert by_tokens["sources"]["incidents"]["x"] == [30 * 4096, 50 * 4096]


@pytest.mark.parametrize("path, message", [
    ("/api/run/run12/curves?x=nope", "no x axis 'nope': pick one of step, wall, tokens"),
    ("/api/run/run12/figure?metrics=loss,rm", "no metric 'rm': pick from loss"),
    ("/run/run12?x=epoch", "no x axis 'epoch'"),
    ("/compare?runs=run3", "name two runs to compare, e.g. /compare?runs=RUN_A,RUN_B"),
    ("/compare?runs=run3,nope", "no run 'nope' here: pick from run12, run3, run5"),
    ("/compare?runs=run3,run3", "'run3' is named twice"),
    ("/api/compare", "name two runs to compare"),
])
def test_bad_input_gets_one_clear_line(server_url, path, message):
    status, _, body = fetch(server_url + path)
    assert status == 400
    assert message in unescape(body) and "Traceback" not in body


def test_the_latest_incident_is_named_once(server_url):
    _, _, page = fetch(server_url + "/run/run5")
    assert "storage_outage: rank 1 on b7d41e09 reported it" in page
    assert "storage_outage: storage_outage" not in page and "worker_death: worker_death" not in page
    _, _, listing = fetch(server_url + "/")
    assert "storage_outage: rank 1" in listing and "storage_outage: storage_outage" not in listing
    live = json.loads(fetch(server_url + "/api/run/run5/live")[2])
    assert live["last_incident"]["label"] == "storage_outage: rank 1 on b7d41e09 reported it"


def test_an_incident_reads_as_a_table_in_local_time(server_url, runs_folder):
    _, _, html = fetch(server_url + f"/run/run5/incident/{runs_folder.kind_ids['worker_death']}")
    assert '<table id="facts"' in html and '<table id="evidence"' in html and '<table id="decisions"' in html
    assert '<pre id="evidence">' not in html  # no raw JSON dump as the evidence
    from runmgr.choices import IncidentKind

    stopped = ([kind.value for kind in IncidentKind].index("worker_death") // 4 + 1) * 10
    assert f"<tr><th>step</th><td>- (the sub-run stopped at step {stopped})</td></tr>" in html
    assert "<tr><th>ranks</th><td>1</td></tr>" in html and f"<tr><th>nodes</th><td>{NODE}</td></tr>" in html
    assert "<tr><th>evidence.exit_code</th><td>-9</td></tr>" in html
    # The evidence's epoch time reads as this machine's local date and time.
    marks = curves(server_url, "run5")["sources"]["incidents"]
    when = marks["when"][marks["kind"].index("worker_death")]
    assert f"<tr><th>when</th><td>{when}</td></tr>" in html
    assert f"<tr><th>time</th><td>{when} (epoch " in html
    assert "<tr><th>action</th><td><b>restart</b>" in html and "worker_death: restart from the last checkpoint" in html
    assert f"<tr><th>restart_from_step</th><td>{stopped - 10}</td></tr>" in html


def test_two_runs_overlay_with_the_verdict_of_compare(server_url):
    status, _, html = fetch(server_url + "/compare?runs=run3,run12")
    assert status == 200
    assert "<h1>run12 against run3</h1>" in html
    assert "<tr><th>verdict</th><td><b>identical</b></td></tr>" in html  # the scripted steps are the same
    assert "<td>optim.lr</td><td>0.001</td><td>0.00015</td>" in html  # the config diff
    item = json.loads(fetch(server_url + "/api/compare?runs=run3,run12")[2])["item"]
    names = {ref.get("attributes", {}).get("name") for ref in _models(item["doc"])}
    assert {"run3-loss", "run12-loss", "run3-grad_norm", "run12-grad_norm"} <= names
    _, _, run_page = fetch(server_url + "/run/run12")
    assert 'href="/compare?runs=run12,run3"' in run_page


def test_the_plot_html_page_is_linked_and_sandboxed(server_url, runs_folder):
    plots = runs_folder.root / "run3" / "plots"
    plots.mkdir(exist_ok=True)
    (plots / "loss.html").write_text("<html><script>document.title='bokeh'</script></html>")
    _, _, html = fetch(server_url + "/run/run3")
    assert 'href="/run/run3/html/loss.html"' in html
    status, headers, body = fetch(server_url + "/run/run3/html/loss.html")
    assert status == 200 and "document.title" in body
    assert headers["content-security-policy"].startswith("sandbox allow-scripts;")
    assert fetch(server_url + "/run/run3/html/..%2Flogbook.sqlite")[0] == 404


def test_the_timeline_alone_for_the_live_refresh(server_url):
    status, _, html = fetch(server_url + "/run/run12/timeline")
    assert status == 200 and html.count('<article class="subrun"') == 3
    assert "<html" not in html


def _models(node) -> list[dict]:
    """Every object in a bokeh document's JSON."""
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found += _models(value)
    elif isinstance(node, list):
        for value in node:
            found += _models(value)
    return found


def test_figure_endpoint_names_the_models_the_live_refresh_updates(server_url):
    body = json.loads(fetch(server_url + "/api/run/run5/figure?metrics=loss,lr")[2])
    names = {ref.get("attributes", {}).get("name") for ref in _models(body["item"]["doc"])}
    assert {"x", "kinds", "incidents", "kept-loss", "lost-loss", "kept-lr", "strip", "panel-loss"} <= names
    assert body["shape"].startswith("5.00,5.01,5.02|")
