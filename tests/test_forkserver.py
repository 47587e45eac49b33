"""The tests' fork server (tests/forkserver.py) as a launch's driver uses it (tests/cli.py
``start_runmgr``): a child appends to a log that is both its stdout and stderr, as
``stderr=STDOUT`` with a file opened for appending would; a signal sent to it ends it as it
would end ``python`` itself; each start has an exit file of its own; a child may read its standard
input from a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.forkserver import ForkServer

ROOT = Path(__file__).resolve().parents[1]


def test_children_append_to_one_log_and_a_signal_ends_one_as_it_ends_python(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import sys, time\nprint('out', sys.argv[1], flush=True)\n"
                      "print('err', sys.argv[1], file=sys.stderr, flush=True)\n"
                      "if sys.argv[1] == 'waits':\n    time.sleep(600)\n")
    log = tmp_path / "driver.log"
    log.write_text("earlier\n")
    server = ForkServer([])
    try:
        first = server.start(["first"], script=str(script), cwd=str(tmp_path), env={}, stdout=log, stderr=log,
                             append=True, exit_file=tmp_path / "first.exit")
        assert first.wait(60) == 0
        waits = server.start(["waits"], script=str(script), cwd=str(tmp_path), env={}, stdout=log, stderr=log,
                             append=True, exit_file=tmp_path / "waits.exit")
        while "out waits" not in log.read_text():  # the child's own word that it runs
            assert waits.poll() is None, log.read_text()
            time.sleep(0.02)
        waits.send_signal(signal.SIGTERM)
        assert waits.wait(60) == -signal.SIGTERM
    finally:
        server.close()
    assert log.read_text().splitlines() == ["earlier", "out first", "err first", "out waits", "err waits"]


def test_without_append_a_child_replaces_its_output(tmp_path):
    out, err = tmp_path / "out", tmp_path / "err"
    out.write_text("old\n")
    script = tmp_path / "new.py"
    script.write_text("print('new')\n")
    server = ForkServer([])
    try:
        child = server.start([], script=str(script), cwd=str(tmp_path), env={}, stdout=out, stderr=err)
        assert child.wait(60) == 0
    finally:
        server.close()
    assert out.read_text() == "new\n" and err.read_text() == ""


def test_a_preloaded_module_runs_as_main_as_a_new_python_runs_it(tmp_path):
    """`python -m PKG.MOD` of a module the server preloaded (tests/cli.py preloads trainer.data.prepare):
    run once as ``__main__``, not also in ``sys.modules``, and no warning from runpy on stderr that a
    new Python would not print."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "cmd.py").write_text(
        "import sys\nif __name__ == '__main__':  # not at the server's import: its stdout is the protocol's\n"
        "    print(__name__, 'pkg.cmd' in sys.modules, sys.argv[1:])\n")
    out, err = tmp_path / "out", tmp_path / "err"
    server = ForkServer(["pkg.cmd"], env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    try:
        child = server.start(["x"], module="pkg.cmd", cwd=str(tmp_path), env={}, stdout=out, stderr=err)
        assert child.wait(60) == 0
    finally:
        server.close()
    assert err.read_text() == ""
    assert out.read_text() == "__main__ False ['x']\n"


def test_a_child_reads_its_standard_input_from_a_file_and_nothing_without_one(tmp_path):
    """``watch follow -`` as the README runs it: the lines come from a file on fd 0, to its end; a
    child given none reads /dev/null (an immediate end, never the server's own requests)."""
    script = tmp_path / "cat.py"
    script.write_text("import sys\nlines = sys.stdin.readlines()\nprint(len(lines), ''.join(lines), end='')\n")
    given = tmp_path / "in.txt"
    given.write_text("one\ntwo\n")
    server = ForkServer([])
    try:
        fed = server.start([], script=str(script), cwd=str(tmp_path), env={}, stdout=tmp_path / "fed.out",
                           stderr=tmp_path / "fed.err", stdin=given)
        alone = server.start([], script=str(script), cwd=str(tmp_path), env={}, stdout=tmp_path / "alone.out",
                             stderr=tmp_path / "alone.err")
        assert fed.wait(60) == 0 and alone.wait(60) == 0
    finally:
        server.close()
    assert (tmp_path / "fed.out").read_text() == "2 one\ntwo\n" and (tmp_path / "fed.err").read_text() == ""
    assert (tmp_path / "alone.out").read_text() == "0 "


FORKED_SERVER = """
import os, sys
from pathlib import Path
from tests.forkserver import ForkServer

tmp = Path(sys.argv[1])
server = ForkServer.forked(["json"])  # at the start of a fresh process, as the dry run forks it
try:
    child = server.start(["3"], script=str(tmp / "child.py"), cwd=str(tmp), env={"WHO": "child"},
                         stdout=tmp / "out", stderr=tmp / "err")
    print("exit", child.wait(60), "own pid", child.pid != os.getpid(), "own env", "WHO" not in os.environ)
finally:
    server.close()
"""


def test_a_server_forked_from_this_process_runs_children_as_the_other_does(tmp_path):
    """``ForkServer.forked`` (bench/accelerator_check.py's dry run): no new Python; a child has its
    own environment, output files and exit code, and the server ends when closed. In a fresh
    process of its own, as the dry run forks it: a pytest worker has threads (xdist's, a Ray
    driver's) whose locks a fork may copy held, and once a forked server's child never ran."""
    (tmp_path / "child.py").write_text("import os, sys\nprint('out', os.environ['WHO'])\n"
                                       "print('err', file=sys.stderr)\nsys.exit(int(sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", FORKED_SERVER, str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["exit 3 own pid True own env True"]
    assert (tmp_path / "out").read_text() == "out child\n" and (tmp_path / "err").read_text() == "err\n"
