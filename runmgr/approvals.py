"""A person's answer to a remedy a run holds for one (``policy.act_on``): ``runmgr approve RUN``
and ``runmgr decline RUN`` write it into the run directory, the driver takes it at its next poll.

The answer names the sub-run that holds the remedy, so an answer meant for an earlier hold is
never taken for a later one; the driver takes it once (the file is renamed as it is read).
"""

from __future__ import annotations

import getpass
import json
import os
import time
from pathlib import Path
from typing import Optional, TextIO

from runmgr.controller.states import Verdict
from runmgr.errors import RunStateError
from runmgr.status import read_status, resolve_run_dir

ANSWER_FILE = "approval.json"
"""In the run directory: the answer the driver has not taken yet."""
AWAITING = "awaiting_approval"


def write_answer(run_dir: Path, subrun: str, approved: bool, by: str, at: float) -> None:
    temporary = run_dir / (ANSWER_FILE + ".tmp")
    temporary.write_text(json.dumps({"subrun": subrun, "approved": approved, "by": by, "at": at}))
    os.replace(temporary, run_dir / ANSWER_FILE)


def take_answer(run_dir: Path, subrun: str) -> Optional[Verdict]:
    """The answer to ``subrun``'s held remedy, once (None: none yet). An answer to another
    sub-run is left where it is (its own hold ended; the command refused nothing then)."""
    path = run_dir / ANSWER_FILE
    try:
        answer = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # torn or foreign: the command writes atomically, so not its own
        return None
    if answer.get("subrun") != subrun:
        return None
    os.replace(path, run_dir / f"approval.{subrun}.taken.json")  # kept: who answered, for a person
    return Verdict(bool(answer["approved"]), str(answer.get("by", "?")), float(answer.get("at", 0.0)))


def answer(run: str, approved: bool, out: TextIO) -> int:
    """``runmgr approve RUN`` / ``runmgr decline RUN``: 0 once written; RunStateError (one line,
    exit 2) when the run holds nothing for a person."""
    run_dir = resolve_run_dir(run)
    status = read_status(run_dir)
    held = status.get("awaiting")
    if status.get("state") != AWAITING or not held:
        raise RunStateError(f"run {run} holds no remedy for a person (state: {status.get('state')}); "
                            f"`runmgr status {run}` says what it is doing")
    by = _who()
    write_answer(run_dir, status["subrun"], approved, by, time.time())
    verb = "approved" if approved else "declined"
    then = "the driver carries it out at its next poll" if approved else "the run goes on without it"
    out.write(f"runmgr: {by} {verb} {held['action']} for the {held['incident']}: {then}\n")
    return 0


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return f"uid {os.getuid()}"
