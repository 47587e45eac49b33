"""The page over HTTP, through the real server: what it shows, what it
escapes, and that it answers nothing but GET and HEAD and writes nothing."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request

import pytest

from logbook import LOGBOOK_FILENAME
from tests.logbook.web.conftest import IMG_ATTACK, SCRIPT_ATTACK, SKIPPED_TEXT, STACK_TEXT


def fetch(url: str, method: str = "GET", host: str | None = None) -> tuple[int, dict, str]:
    request = urllib.request.Request(url, method=method, data=b"x" if method in ("POST", "PUT", "PATCH") else None)
    if host:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_runs_list_shows_each_run_with_its_figures(server_url):
    status, _, html = fetch(server_url + "/")
    assert status == 200
    assert 'href="/run/run12"' in html and 'href="/run/run3"' in html
    assert "running" in html and "finished" in html
    assert 'href="/run/run12/incident/' in html  # the last incident links to its details


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", ["/", "/run/run12", "/api/run/run12/live", "/static/page.js", "/no/such/page"])
def test_only_get_and_head_are_answered(server_url, runs_folder, method, path):
    before = hashlib.sha256((runs_folder.live_dir / LOGBOOK_FILENAME).read_bytes()).hexdigest()
    status, headers, _ = fetch(server_url + path, method)
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    assert hashlib.sha256((runs_folder.live_dir / LOGBOOK_FILENAME).read_bytes()).hexdigest() == before


def test_head_is_answered(server_url):
    status, _, body = fetch(server_url + "/run/run12", "HEAD")
    assert (status, body) == (200, "")


def test_run_strings_are_escaped_in_the_html(server_url, runs_folder):
    _, headers, html = fetch(server_url + "/run/run12")
    assert SCRIPT_ATTACK not in html and IMG_ATTACK not in html
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=&#34;window.pwned=1&#34;&gt;" in html
    assert "script-src 'self'" in headers["content-security-policy"]
    _, _, incident = fetch(server_url + f"/run/run12/incident/{runs_folder.incident_ids[1]}")
    assert SCRIPT_ATTACK not in incident and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in incident


def test_timeline_shows_why_each_subrun_started_and_what_changed(server_url):
    _, _, html = fetch(server_url + "/run/run12")
    for subrun in ("12.00", "12.01", "12.02"):
        assert f'id="subrun-{subrun}"' in html
    assert "torchrun --nnodes 1 pretrain_gpt.py" in html  # the Megatron job's command
    assert "optim.lr" in html  # the config diff
    assert "checkpoints/step_00000040" in html  # where it resumed, relative to the run dir
    assert "rollback_skip" in html and "check-12.01.json" in html


def test_incident_details(server_url, runs_folder):
    hang, spike = runs_folder.incident_ids
    _, _, html = fetch(server_url + f"/run/run12/incident/{hang}")
    assert html.index("rank 0") < html.index("rank 1")  # every rank's stack, rank 0 first
    assert "all_reduce (torch/distributed.py:42)" in STACK_TEXT and "all_reduce (torch/distributed.py:42)" in html
    assert '&#34;silent_s&#34;: 120.0' in html  # evidence, pretty-printed
    assert "gemm_tflops" in html  # the health report the next sub-run's start names
    _, _, html = fetch(server_url + f"/run/run12/incident/{spike}")
    assert "[300, 320)" in html
    assert "decoded sample #12: &lt;b&gt;bold&lt;/b&gt; &amp; more" in html and SKIPPED_TEXT not in html


def test_json_endpoints(server_url):
    status, headers, body = fetch(server_url + "/api/run/run12/live")
    assert status == 200 and headers["content-type"] == "application/json"
    live = json.loads(body)
    assert (live["state"], live["last_step"], live["subruns"], live["live"]) == ("running", 45, 3, True)
    assert live["last_incident"]["summary"] == SCRIPT_ATTACK
    curves = json.loads(fetch(server_url + "/api/run/run12/curves?metrics=loss")[2])
    sources = curves["sources"]
    parts = {(subrun, kept): xs for kept in ("kept", "lost")
             for subrun, xs in zip(sources[f"{kept}-loss"]["subrun"], sources[f"{kept}-loss"]["xs"])}
    assert parts[("12.00", "kept")] == list(range(1, 21)) and parts[("12.00", "lost")] == list(range(21, 31))
    assert parts[("12.01", "lost")] == list(range(41, 51)) and parts[("12.02", "kept")] == list(range(41, 46))
    marks = curves["sources"]["incidents"]
    assert list(zip(marks["x"], marks["kind"])) == [(30, "hang"), (50, "loss_spike")]
    status, headers, body = fetch(server_url + "/api/run/run12/skipped")
    assert status == 200 and body == SKIPPED_TEXT and headers["content-type"].startswith("text/plain")


def test_unknown_names_are_404_and_bad_metric_400(server_url):
    assert fetch(server_url + "/run/..%2F..%2Fetc")[0] == 404
    assert fetch(server_url + "/run/nope")[0] == 404
    assert fetch(server_url + "/run/run12/incident/999")[0] == 404
    assert fetch(server_url + "/api/run/run12/curves?metrics=rm")[0] == 400


def test_other_host_names_are_refused(server_url):
    # A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) gets nothing.
    assert fetch(server_url + "/api/run/run12/live", host="evil.example")[0] == 400


def test_a_readonly_open_cannot_write(runs_folder):
    from logbook.web.readonly import open_read_only

    with open_read_only(runs_folder.live_dir) as book:
        assert book.summary()["last_step"] == 45
        with pytest.raises(Exception, match="readonly|read-only|query_only"):
            book.record_event("12.02", "note", "written through the page")


def test_the_run_page_shows_the_cost_of_each_incident_class_as_the_report_counts_it(server_url, runs_folder):
    from logbook.report import run_report
    from logbook.web.readonly import open_read_only

    with open_read_only(runs_folder.root / "run12") as book:
        costs = run_report(book).costs
    _, _, html = fetch(server_url + "/run/run12")
    assert costs and "Cost by incident class" in html
    for cost in costs:
        assert f"<tr><td>{cost.kind}</td><td>{cost.incidents}</td><td>{cost.restarts}</td><td>{cost.steps_lost}</td>" in html
