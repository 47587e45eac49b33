"""The page on a read-only mount (Kubernetes' logbook-page component mounts the
shared volume read-only): a finished run's logbook (no -wal file: no writer is
open) is read; a mount is made read-only for real, with a bind mount in a mount
namespace of its own (unshare), as root can."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from logbook import Logbook

ROOT = Path(__file__).resolve().parents[3]
READ = ("from pathlib import Path; import sys; from logbook.web.readonly import open_read_only\n"
        "with open_read_only(Path(sys.argv[1])) as book:\n"
        "    print(len(book.lineage()), max(r['step'] for r in book.kept_metrics()))\n")


def can_mount_read_only() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not can_mount_read_only(), reason="needs root and unshare (a read-only bind mount)")
def test_a_finished_run_is_read_on_a_read_only_mount(tmp_path):
    run_dir = tmp_path / "runs" / "run3"
    with Logbook.open(run_dir) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("3.00", [{"step": step, "loss": 2.0, "grad_norm": 1.0, "lr": 1e-3} for step in range(1, 6)])
        book.end_subrun("3.00", "finished", 5, "trained")
    assert not list(run_dir.glob("*-wal"))  # the writer closed: SQLite removed its WAL
    folder = tmp_path / "runs"
    script = (f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && "
              f"touch {folder}/probe 2>/dev/null && echo writable; "
              f"exec {sys.executable} -c \"$0\" {run_dir}")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script, READ], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1", "5"]  # one sub-run, steps 1-5: not "writable", not an error
