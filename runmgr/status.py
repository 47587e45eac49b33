"""The live state of a run, as ``runmgr status RUN --json`` shows it.

The driver rewrites ``<run dir>/status.json`` atomically on every transition
and poll; ``runmgr status`` reads it and checks that the driver still lives.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from runmgr.errors import RunStateError

STATUS_FILE = "status.json"
ENDED_STATES = ("finished", "failed", "stopped")
"""States a driver leaves behind on purpose: its workers are gone with it."""


def write_status(run_dir: Path, status: dict) -> None:
    """Replace the status file atomically (a reader never sees half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".status.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(status, f, indent=1, sort_keys=True)
        os.replace(tmp, run_dir / STATUS_FILE)
    except OSError:
        os.unlink(tmp)  # a full disk leaves no half-written temp file behind
        raise


def write_starting(run_dir: Path, run_name: str, train_iters: int, start_step: int, doing: str) -> None:
    """The status of a driver still getting ready (before its first sub-run's controller keeps
    the file): ``state`` starting and what it is ``doing`` (starting Ray, checking the nodes)."""
    write_status(run_dir, {"run": run_name, "run_dir": str(run_dir), "driver_pid": os.getpid(),
                           "train_iters": train_iters, "state": "starting", "doing": doing, "subrun": None,
                           "step": start_step, "workers": [], "last_incident": None, "updated_at": time.time()})


def resolve_run_dir(run: str, runs_root: Path = Path("runs")) -> Path:
    """``RUN`` is a run name under runs/ or a run directory."""
    candidates = [Path(run), runs_root / run]
    for path in candidates:
        if (path / STATUS_FILE).is_file() or (path / "logbook.sqlite").is_file():
            return path
    raise RunStateError(f"no run {run!r}: neither {candidates[0]} nor {candidates[1]} holds a run "
                        f"(start one with `runmgr launch conf=demo`)")


def read_status(run_dir: Path) -> dict:
    """The status file with ``driver_alive`` and ``driver_lost`` (the driver is gone and never
    wrote an end: its workers may still be running out their lease) added; RunStateError when it
    is missing or damaged."""
    path = run_dir / STATUS_FILE
    if not path.is_file():
        raise RunStateError(f"{run_dir} has no status yet: the run has not started a driver")
    status = _parse(path)
    status["driver_alive"] = pid_alive(status.get("driver_pid"))
    status["driver_lost"] = not status["driver_alive"] and status.get("state") not in ENDED_STATES
    if status["driver_lost"]:
        status["state"] = f"stopped ({status.get('state')} when the driver was lost)"
    return status


def _parse(path: Path) -> dict:
    """The status file's object; a damaged one (only a hand or a failing disk
    makes one: the driver replaces it atomically) is one line saying so."""
    try:
        status = json.loads(path.read_bytes())
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bad UTF-8
        raise RunStateError(f"{path} is unreadable ({err}): a live driver rewrites it on its next poll; "
                            f"`runmgr logbook show {path.parent}` has the run's history") from None
    if not isinstance(status, dict) or not _well_typed(status):
        raise RunStateError(f"{path} is not a runmgr status (a JSON object with the run's state): a live driver "
                            f"rewrites it on its next poll; `runmgr logbook show {path.parent}` has the run's history")
    return status


def _well_typed(status: dict) -> bool:
    """The fields readers compute with have the types the driver writes."""
    workers, pid, updated = status.get("workers", []), status.get("driver_pid"), status.get("updated_at", 0)
    return (isinstance(workers, list) and all(isinstance(w, dict) for w in workers)
            and (pid is None or type(pid) is int and pid > 0)
            and type(updated) in (int, float))


def mark_stopped(run_dir: Path, reason: str, state: str = "stopped") -> None:
    """Record in the status file that the driver stopped on request (``failed``:
    it had to stop, e.g. on a full disk), its workers stopped."""
    path = run_dir / STATUS_FILE
    try:
        status = _parse(path) if path.is_file() else {"run_dir": str(run_dir)}
    except RunStateError:  # damaged: the stop is what matters now, written whole
        status = {"run_dir": str(run_dir)}
    status.update(state=state, workers=[], last_incident=reason, updated_at=time.time())
    write_status(run_dir, status)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def render_status(status: dict) -> str:
    lines = [
        f"run {status.get('run')}  state {status.get('state')}  sub-run {status.get('subrun')}  "
        f"step {status.get('step')}/{status.get('train_iters')}",
        f"driver pid {status.get('driver_pid')} ({'alive' if status.get('driver_alive') else 'gone'})",
    ]
    if status.get("state") == "starting" and status.get("doing"):
        lines.append(f"the driver is {status['doing']}")
    for w in status.get("workers", []):
        lines.append(f"  rank {w.get('rank', '?'):>3}  pid {w.get('pid', '?'):>7}  node {w.get('node_ip', '?')}  "
                     f"{str(w.get('node', '?'))[:12]}")
    if status.get("ready_spares") is not None:
        lines.append(f"warm spares ready: {status['ready_spares']}")
    if status.get("paused_ranks"):
        lines.append(f"paused after step {status.get('step')}: ranks {', '.join(map(str, status['paused_ranks']))} "
                     f"(chaos pause_at_step; the logbook names the file that releases them)")
    metrics = status.get("metrics")
    if isinstance(metrics, dict) and metrics.get("address") and status.get("driver_alive"):
        lines.append(f"metrics: http://{metrics['address']}/metrics")
    held = status.get("awaiting")
    if isinstance(held, dict) and held.get("action"):
        lines.append(f"waiting for a person: runmgr would {held['action']} for the {held.get('incident')}; "
                     f"`runmgr approve {status.get('run')}` carries it out, `runmgr decline {status.get('run')}` "
                     f"goes on without it")
    if status.get("last_incident"):
        lines.append(f"last incident: {status['last_incident']}")
    return "\n".join(lines)
