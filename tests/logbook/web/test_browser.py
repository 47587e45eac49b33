"""The page in a real headless browser: Debian's chromium (``make chromium``)
driven by playwright's Python package, over the real server on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Iterator

import pytest

from tests.logbook.conftest import train
from tests.logbook.conftest import ScriptedRun
from tests.logbook.web.conftest import IMG_ATTACK, SCRIPT_ATTACK

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTES_SCREENSHOT = Path("/work/notes/i12_serve_timeline.png")
"""Where the screenshot of the timeline is also kept for the issue's note, when that folder exists."""


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator:
    """A fresh chromium page that records console errors, page errors and every request."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1200, "height": 1400})
        page = context.new_page()
        page.problems, page.requests = [], []
        page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: page.problems.append(f"page error: {e}"))
        page.on("request", lambda r: page.requests.append(r.url))
        try:
            yield page
        finally:
            context.close()


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


def assert_clean(page) -> None:
    assert page.problems == []
    hosts = {url.split("/")[2] for url in page.requests if url.startswith("http")}
    assert all(host.split(":")[0] == "127.0.0.1" for host in hosts), hosts
    assert all(url.startswith("http://127.0.0.1:") for url in page.requests), page.requests


def test_runs_list_timeline_plot_and_escaping(browser_page, server_url, runs_folder, tmp_path):
    page = browser_page
    page.goto(server_url + "/")
    assert page.locator("#runs tbody tr").count() == 2
    assert page.locator("#runs").inner_text().count("running") == 1
    page.click("text=run12")
    page.wait_for_selector("#chart svg polyline")
    assert page.locator("#chart polyline").count() == 5  # 12.00 kept+lost, 12.01 kept+lost, 12.02
    assert page.locator("#chart polyline.lost").count() == 2
    assert page.locator("#chart text.incident").all_text_contents() == ["hang", "loss_spike"]
    assert page.locator(".subrun").count() == 3
    # The hostile strings are text on the page, and nothing ran.
    assert page.locator("#subrun-12\\.01 .cause").inner_text() == IMG_ATTACK
    assert SCRIPT_ATTACK in page.locator("#live-incident").inner_text()
    assert page.evaluate("typeof window.pwned") == "undefined"
    shot = tmp_path / "timeline.png"
    page.screenshot(path=str(shot), full_page=True)
    assert distinct_rows(shot.read_bytes()) > 100  # text, curves, boxes: not one flat colour
    if NOTES_SCREENSHOT.parent.is_dir():
        shutil.copyfile(shot, NOTES_SCREENSHOT)
    page.click(f"a[href='/run/run12/incident/{runs_folder.incident_ids[1]}']")
    page.wait_for_selector("#evidence")
    assert SCRIPT_ATTACK in page.locator("h1 + .summary").inner_text()
    assert json.dumps(IMG_ATTACK) in page.locator("#evidence").inner_text()  # pretty-printed JSON, as text
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert_clean(page)


def test_live_run_page_updates_without_a_reload(browser_page, server_url, runs_folder):
    page = browser_page
    page.goto(server_url + "/run/run12")
    page.wait_for_selector("#chart svg polyline")
    page.evaluate("window.sameDocument = true")  # gone if the page were reloaded
    assert page.locator("#live-step").inner_text() == "45"
    book, clock = runs_folder.book, runs_folder.clock
    train(book, ScriptedRun(runs_folder.live_dir, clock), "12.02", 46, 60)
    book.record_incident("12.02", "slow_node", "node-b is 30% slower than the others", {"node": "node-b"}, step=60)
    page.wait_for_function("() => document.getElementById('live-step').textContent === '60'")
    page.wait_for_function("() => document.getElementById('live-incident').textContent.includes('slow_node')")
    # The chart is redrawn with the new steps: it now reaches step 60.
    page.wait_for_function("() => document.querySelector('#chart svg').dataset.lastStep === '60'")
    assert page.evaluate("window.sameDocument") is True
    assert_clean(page)
