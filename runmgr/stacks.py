"""Every rank's Python stack, dumped with py-spy before a hung sub-run is
killed, into ``<run dir>/stacks/<sub-run>/rank<N>.txt`` for a person to read."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from runmgr.controller.group import WorkerInfo

DUMP_TIMEOUT_S = 20.0


def stacks_dir(run_dir: Path, subrun: str) -> Path:
    """Where the stacks of ``subrun``'s ranks are dumped."""
    return run_dir / "stacks" / subrun


def dump_stacks(run_dir: Path, subrun: str, workers: Sequence[WorkerInfo]) -> list[Path]:
    """One file per rank; a rank that cannot be dumped gets a file saying why."""
    out_dir = stacks_dir(run_dir, subrun)
    out_dir.mkdir(parents=True, exist_ok=True)
    beside_python = Path(sys.executable).parent / "py-spy"
    py_spy = shutil.which("py-spy") or (str(beside_python) if beside_python.exists() else None)
    written = []
    for worker in workers:
        target = out_dir / f"rank{worker.rank}.txt"
        target.write_text(_dump(py_spy, worker))
        written.append(target)
    return written


def _dump(py_spy: str | None, worker: WorkerInfo) -> str:
    header = f"rank {worker.rank}  pid {worker.pid}  node {worker.node_ip} ({worker.node_id})\n"
    if py_spy is None:
        return header + "py-spy is not installed (it comes with ray[default]); no stack dumped\n"
    try:
        result = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(worker.pid)], capture_output=True, text=True,
                                timeout=DUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return header + f"py-spy dump did not finish within {DUMP_TIMEOUT_S:.0f} s\n"
    return header + (result.stdout or "") + (result.stderr or "")
