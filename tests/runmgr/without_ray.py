"""``python -m runmgr ARGS`` in a new Python where importing Ray ends the process: a command
that reaches Ray (to start a local one, to connect, to place) exits with
:data:`RAY_IMPORTED_EXIT` and says so on stderr. A fresh interpreter, not the tests' fork
server: the server's ``sys.path`` is fixed when it starts, so it could not hide Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAY_IMPORTED_EXIT = 97
"""The exit code of a command that imported Ray."""
_POISON = """import os, sys
sys.stderr.write("RAY IMPORTED: this command was to run without Ray\\n")
sys.stderr.flush()
os._exit({code})
"""


def runmgr_without_ray(scratch: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``runmgr *args`` with a ``ray`` package on the path that ends the process when
    imported (written under ``scratch``); returns the result and its wall time in seconds."""
    poison = scratch / "no-ray"
    (poison / "ray").mkdir(parents=True, exist_ok=True)
    (poison / "ray" / "__init__.py").write_text(_POISON.format(code=RAY_IMPORTED_EXIT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(poison), str(ROOT)]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "runmgr", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done, time.monotonic() - started
