"""The page in a real headless browser: Debian's chromium (``make chromium``)
driven by playwright's Python package, over the real server on 127.0.0.1.
One browser and one server for the module; each test opens its own page.

What a person watching a run does: zooms the curves, hovers an incident's
marker, watches the timeline move as the run restarts, reads an incident,
overlays two runs (issue 32 item 5)."""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path
from typing import Iterator

import pytest

from logbook import Logbook
from tests.logbook.conftest import ScriptedRun, train
from tests.logbook.web.conftest import IMG_ATTACK, SCRIPT_ATTACK

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path("/tmp/shots")
"""Screenshots of the page for the issue's note (not committed)."""
MARKER_AT = """(kind) => {
  // Where the strip draws the incident of ``kind``, in the page's coordinates.
  const doc = Bokeh.documents[Bokeh.documents.length - 1];
  const source = doc.get_model_by_name("incidents");
  const i = source.data.kind.indexOf(kind);
  const strip = Bokeh.index.query_one((view) => view.model.name === "strip");
  const box = strip.el.getBoundingClientRect();
  return [box.left + strip.frame.x_scale.compute(source.data.x[i]),
          box.top + strip.frame.y_scale.compute(strip.frame.y_range.synthetic(kind))];
}"""
PANEL_BOX = """(name) => {
  const panel = Bokeh.index.query_one((view) => view.model.name === name);
  const box = panel.el.getBoundingClientRect(), frame = panel.frame.bbox;
  return [box.left + frame.left, box.top + frame.top, frame.width, frame.height];
}"""
DOC = "Bokeh.documents[Bokeh.documents.length - 1]"
"""The document drawn last (a new sub-run draws the chart anew)."""
X_RANGE = f"() => {{ const r = {DOC}.get_model_by_name('x'); return [r.start, r.end]; }}"
DRAWN = "() => document.getElementById('chart').dataset.embedded !== undefined"


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator:
    """One chromium for the module's tests."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1300, "height": 1100})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser) -> Iterator:
    """A fresh tab that records console errors, page errors and every request."""
    tab = browser.new_page()
    tab.problems, tab.requests = [], []
    tab.on("console", lambda m: m.type == "error" and tab.problems.append(f"console: {m.text}"))
    tab.on("pageerror", lambda e: tab.problems.append(f"page error: {e}"))
    tab.on("request", lambda r: tab.requests.append(r.url))
    try:
        yield tab
    finally:
        tab.close()


def distinct_rows(data: bytes) -> int:
    """How many different scanlines a PNG holds (as filtered bytes): 1 for an image of one flat colour."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, kind = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and kind in (2, 6)
    chunks, at = [], 8
    while at < len(data):
        length, tag = struct.unpack(">I4s", data[at:at + 8])
        if tag == b"IDAT":
            chunks.append(data[at + 8:at + 8 + length])
        at += 12 + length
    raw = zlib.decompress(b"".join(chunks))
    stride = width * (3 if kind == 2 else 4) + 1
    return len({raw[row * stride:(row + 1) * stride] for row in range(height)})


def shoot(page, name: str, full_page: bool = True) -> Path:
    """A screenshot kept under :data:`SHOTS`; it must not be one flat colour."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path), full_page=full_page)
    assert distinct_rows(path.read_bytes()) > 100
    return path


def assert_clean(page) -> None:
    assert page.problems == []
    assert all(url.startswith("http://127.0.0.1:") for url in page.requests), page.requests


def drag_across_the_loss_panel(page, start: float, end: float) -> None:
    """A person's drag from ``start`` to ``end`` (shares of the panel's width): a box zoom."""
    left, top, width, height = page.evaluate(PANEL_BOX, "panel-loss")
    page.mouse.move(left + width * start, top + height / 2)
    page.mouse.down()
    page.mouse.move(left + width * end, top + height / 2, steps=4)
    page.mouse.up()


def test_curves_zoom_and_every_incident_kind_hovers(page, server_url, runs_folder):
    page.goto(server_url + "/run/run5")
    page.wait_for_function(DRAWN)
    kinds = sorted(runs_folder.kind_ids)
    assert page.evaluate("() => Bokeh.documents[0].get_model_by_name('kinds').factors") == kinds
    drawn = page.evaluate("() => Bokeh.documents[0].get_model_by_name('incidents').data.kind")
    assert sorted(drawn) == kinds  # every kind has its marker, worker_death and device_fault included
    shoot(page, "page-run.png")
    # Hovering a marker names the incident and what was decided, in a tooltip (no label on the chart).
    page.locator("#chart").scroll_into_view_if_needed()
    for kind in ("device_fault", "worker_death"):
        page.mouse.move(*page.evaluate(MARKER_AT, kind))
        tooltip = page.locator(".bk-tooltip-content", has_text=kind).first
        tooltip.wait_for(state="visible")
        assert "decision" in tooltip.inner_text() and f"restart: {kind}: restart" in tooltip.inner_text()
    shoot(page, "page-hover-incident.png", full_page=False)
    # Dragging across the loss panel zooms every panel to the dragged steps.
    before = page.evaluate(X_RANGE)
    drag_across_the_loss_panel(page, 0.25, 0.5)
    page.wait_for_function(f"() => ({X_RANGE})()[1] - ({X_RANGE})()[0] < {(before[1] - before[0]) / 2}")
    start, end = page.evaluate(X_RANGE)
    assert before[0] < start < end < before[1]
    shared = page.evaluate("() => Bokeh.documents[0].get_model_by_name('panel-lr').x_range.name")
    assert shared == "x"
    assert_clean(page)


def test_the_timeline_and_curves_follow_a_live_run(page, server_url, runs_folder):
    run_dir, clock = runs_folder.root / "watch", runs_folder.clock
    book = Logbook.open(run_dir, clock=clock)
    run = ScriptedRun(run_dir, clock)
    try:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {"optim": {"lr": 1e-3}})
        train(book, run, "1.00", 1, 10)
        page.goto(server_url + "/run/watch")
        page.wait_for_function(DRAWN)
        page.evaluate("window.sameDocument = true")  # gone if the page were reloaded
        assert page.locator("#subrun-1\\.00 .state").inner_text() == "running"
        incident = book.record_incident("1.00", "worker_death", "worker_death: rank 1 died: process killed",
                                        {"exit_code": -9}, step=None, ranks=[1], nodes=["node-b"])
        book.record_decision("1.00", incident, "restart", "rank 1 died; restart from step 10", {})
        book.end_subrun("1.00", "restarting", 10, "worker_death")
        # The header and the timeline agree: no "1.00 running" under a "restarting" run.
        page.wait_for_function("() => document.querySelector('#subrun-1\\\\.00 .state').textContent === 'restarting'")
        assert page.locator("#live-state").inner_text() == "restarting"
        assert page.locator("#live-incident").inner_text() == "worker_death: rank 1 died: process killed"
        book.start_subrun("1.01", "worker_death: rank 1 died", {}, None, 10, {}, {"optim": {"lr": 1e-3}})
        train(book, run, "1.01", 11, 25)
        # The page marks what it has finished showing (header, timeline and curves) in data-polled.
        page.wait_for_function("() => document.body.dataset.polled.split('|')[2] === '25'")
        assert page.locator("#subrun-1\\.01 .state").inner_text() == "running"
        assert page.locator("#legend span").all_inner_texts() == ["sub-run 1.00", "sub-run 1.01"]
        xs = page.evaluate(f"() => {DOC}.get_model_by_name('kept-loss').data.xs.map((line) => line[line.length - 1])")
        assert max(xs) == 25
        marks = page.evaluate(f"() => {DOC}.get_model_by_name('incidents').data")
        assert (marks["kind"], marks["x"]) == (["worker_death"], [10])
        # A zoom survives the refreshes while the run goes on: the curves' data is replaced in place.
        page.locator("#chart").scroll_into_view_if_needed()
        drag_across_the_loss_panel(page, 0.2, 0.5)
        page.wait_for_function(f"() => ({X_RANGE})()[1] < 20")
        zoomed, drawn = page.evaluate(X_RANGE), page.evaluate("() => document.getElementById('chart').dataset.embedded")
        train(book, run, "1.01", 26, 30)
        page.wait_for_function("() => document.body.dataset.polled.split('|')[2] === '30'")
        assert page.evaluate(X_RANGE) == zoomed
        assert page.evaluate("() => document.getElementById('chart').dataset.embedded") == drawn
        assert page.evaluate("window.sameDocument") is True
        assert_clean(page)
    finally:
        book.close()
        shutil.rmtree(run_dir)  # the other tests' runs list stays as the fixture made it


def test_an_incident_renders_as_a_table_and_run_strings_stay_text(page, server_url, runs_folder):
    page.goto(server_url + "/run/run12")
    page.wait_for_function(DRAWN)
    assert page.locator("#subrun-12\\.01 .cause").inner_text() == IMG_ATTACK
    assert SCRIPT_ATTACK in page.locator("#live-incident").inner_text()
    page.click(f"#timeline a[href='/run/run12/incident/{runs_folder.incident_ids[1]}']")
    page.wait_for_selector("#evidence")
    assert SCRIPT_ATTACK in page.locator("h1 + .summary").inner_text()
    rows = dict(zip(page.locator("#evidence th").all_inner_texts(), page.locator("#evidence td").all_inner_texts()))
    assert rows == {"loss": "9.5", "baseline": "2.1", "note": IMG_ATTACK}
    assert page.evaluate("typeof window.pwned") == "undefined"
    page.goto(server_url + f"/run/run5/incident/{runs_folder.kind_ids['device_fault']}")
    facts = dict(zip(page.locator("#facts th").all_inner_texts(), page.locator("#facts td").all_inner_texts()))
    assert facts["ranks"] == "1" and facts["kind"] == "device_fault" and facts["when"][:2] == "20"
    assert page.locator("#decisions").inner_text().startswith("action\trestart")
    shoot(page, "page-incident.png")
    assert_clean(page)


def test_two_runs_overlay_on_the_compare_page(page, server_url):
    page.goto(server_url + "/run/run3")
    page.click("a[href='/compare?runs=run3,run12']")
    page.wait_for_function(DRAWN)
    lengths = page.evaluate("() => ['run3-loss', 'run12-loss'].map("
                            "(name) => Bokeh.documents[0].get_model_by_name(name).data.x.length)")
    assert lengths == [20, 45]  # each run's kept steps: run12 kept 1-45 through its rollbacks
    assert page.locator("#verdict").inner_text().startswith("verdict\tidentical")
    shoot(page, "page-compare.png")
    assert_clean(page)
