"""``python tests/runmgr/frozen_gcs.py ARGS``: ``python -m runmgr ARGS`` where every local Ray
this process starts has a GCS that stops itself as it starts (tests/runmgr/frozen_gcs.sh).

With ``RAY_gcs_server_port_wait_time_s=0`` alone Ray's wait for the GCS's port was a race:
Ray looks for the port file once before it checks the time, and on a loaded machine the GCS
had sometimes written it before Ray's driver got to look, so that the start succeeded (seen
once beside two busy loops: the launch trained, exit 0). A frozen GCS never writes it."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

FROZEN_GCS = Path(__file__).with_name("frozen_gcs.sh")
ROOT = Path(__file__).resolve().parents[2]


def freeze_gcs() -> str:
    """Start each new local Ray's GCS frozen; returns Ray's own GCS executable (to put back)."""
    from ray._private import services

    real = services.GCS_SERVER_EXECUTABLE
    os.environ["RUNMGR_TEST_REAL_GCS"] = real  # what a frozen GCS runs if it is ever continued
    services.GCS_SERVER_EXECUTABLE = str(FROZEN_GCS)
    return real


def thaw_gcs(real: str) -> None:
    """The next local Ray starts Ray's own GCS again."""
    from ray._private import services

    services.GCS_SERVER_EXECUTABLE = real


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # runmgr itself, not this folder
    freeze_gcs()
    runpy.run_module("runmgr", run_name="__main__", alter_sys=True)
