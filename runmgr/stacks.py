"""Every rank's Python stack, dumped with py-spy before a hung sub-run is
killed, into ``<run dir>/stacks/<sub-run>/rank<N>.txt`` for a person to read."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from runmgr.controller.group import WorkerInfo

DUMP_TIMEOUT_S = 20.0


def stacks_dir(run_dir: Path, subrun: str) -> Path:
    """Where the stacks of ``subrun``'s ranks are dumped."""
    return run_dir / "stacks" / subrun


def find_py_spy() -> Optional[str]:
    """py-spy on the PATH or beside this Python (it comes with ray[default]), or None."""
    beside_python = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside_python) if beside_python.exists() else None)


def dump_pid(py_spy: Optional[str], pid: int) -> str:
    """py-spy's dump of process ``pid`` on this machine, or why there is none."""
    if py_spy is None:
        return "py-spy is not installed (it comes with ray[default]); no stack dumped\n"
    try:
        result = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                                timeout=DUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"py-spy dump did not finish within {DUMP_TIMEOUT_S:.0f} s\n"
    return (result.stdout or "") + (result.stderr or "")


def worker_header(worker: WorkerInfo) -> str:
    return f"rank {worker.rank}  pid {worker.pid}  node {worker.node_ip} ({worker.node_id})\n"


def dump_stacks(run_dir: Path, subrun: str, workers: Sequence[WorkerInfo]) -> list[Path]:
    """One file per rank; a rank that cannot be dumped gets a file saying why."""
    out_dir = stacks_dir(run_dir, subrun)
    out_dir.mkdir(parents=True, exist_ok=True)
    py_spy = find_py_spy()
    written = []
    for worker in workers:
        target = out_dir / f"rank{worker.rank}.txt"
        target.write_text(worker_header(worker) + dump_pid(py_spy, worker.pid))
        written.append(target)
    return written
