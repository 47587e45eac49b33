"""``runmgr logbook serve`` as a user types it: prints its URL, serves until
Ctrl-C and then ends cleanly; a taken port, a bad host or a path with no run
is one line and exit code 2."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.runmgr.test_cli import ROOT, assert_one_line_error, runmgr


@pytest.fixture
def logbook_run(tmp_path):
    from tests.logbook.conftest import write_controller_run

    return write_controller_run(tmp_path / "runs" / "demo").run_dir


def test_serve_prints_its_url_answers_and_ends_cleanly_on_ctrl_c(logbook_run):
    command = [sys.executable, "-m", "runmgr", "logbook", "serve", str(logbook_run.parent), "--port", "0"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith(f"serving {logbook_run.parent} read-only at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url) as answer:
            assert answer.status == 200 and 'href="/run/demo"' in answer.read().decode()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and out.strip() == "stopped"


def test_a_taken_port_is_one_line(logbook_run):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = runmgr("logbook", "serve", str(logbook_run), "--port", str(port))
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is taken")


@pytest.mark.parametrize("host, expected", [("no.such.host.invalid", "is not an address of this machine"),
                                            ("203.0.113.7", "cannot listen on 203.0.113.7")])
def test_a_bad_host_is_one_line(logbook_run, host, expected):
    assert_one_line_error(runmgr("logbook", "serve", str(logbook_run), "--host", host, "--port", "0"), expected)


def test_a_path_with_no_run_is_one_line(tmp_path):
    assert_one_line_error(runmgr("logbook", "serve", str(tmp_path)), "holds no logbook and no run directory")


def test_host_and_port_belong_to_serve(logbook_run):
    result = runmgr("logbook", "show", str(logbook_run), "--port", "1")
    assert_one_line_error(result, "runmgr logbook show: error: unrecognized arguments: --port 1")
    assert "--port is for `runmgr logbook serve`" in result.stderr
    result = runmgr("logbook", "compare", str(logbook_run), str(logbook_run), "--host", "0.0.0.0")
    assert_one_line_error(result, "runmgr logbook compare: error: unrecognized arguments: --host")
