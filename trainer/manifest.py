"""Checkpoint manifests and the checks that decide whether a checkpoint is
trusted. No process group needed: runmgr's driver calls these directly.

A checkpoint is ``<save dir>/step_00000120/``: the files of
torch.distributed.checkpoint plus ``manifest.json``, written last and
atomically once every rank's part is on disk. The manifest lists every file
with its size and sha256, so a truncated or altered file is caught before a
load, with a reason a person understands. It also records the name and shape
of every tensor of the model, so that a resume with a changed model shape is
refused before anything starts from the manifest alone.

DCP's ``.metadata`` is a pickle. A checkpoint folder is data, never code to
run: a verification in full reads it through an allow-list of DCP's own
classes (:mod:`trainer.safe_load`), and so does the trainer's load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
PARAMETERS_FIELD = "parameters"
"""Manifest field: ``{name: shape}`` of every tensor of the saved model's state
dict. Optional within format 1: checkpoints written before it have none."""
DCP_METADATA_NAME = ".metadata"
RETIRED_DIR = "retired"
_STEP_DIR = re.compile(r"^step_(\d{8})$")

PathLike = Union[str, os.PathLike]


def checkpoint_dir(save_dir: PathLike, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(save_dir) / f"step_{step:08d}"


def step_of(path: PathLike) -> Optional[int]:
    """The step encoded in a checkpoint directory name, or None."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(save_dir: PathLike) -> list[Path]:
    """Every ``step_*`` directory under ``save_dir``, oldest step first,
    verified or not (see :func:`verify_checkpoint`)."""
    root = Path(save_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p) or 0)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(directory: Path) -> list[dict]:
    """Name, size and sha256 of every regular file in ``directory`` except the manifest."""
    files = []
    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.startswith(MANIFEST_NAME):
            files.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256_of(path)})
    return files


def write_manifest(directory: Path, fields: dict) -> dict:
    """Write ``manifest.json`` atomically (tmp, fsync, rename, fsync dir) with
    ``fields`` plus the format version and the file list. Call it only once
    every rank's files are on disk: its presence is what makes the
    checkpoint count."""
    manifest = {"format": MANIFEST_FORMAT, **fields, "files": describe_files(directory)}
    tmp = directory / (MANIFEST_NAME + ".tmp")
    with tmp.open("w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, directory / MANIFEST_NAME)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return manifest


def read_manifest(path: PathLike) -> dict:
    """The parsed manifest of the checkpoint at ``path`` (raises OSError or
    ValueError when absent or unparseable; use :func:`verify_checkpoint` to
    get a reason instead)."""
    with (Path(path) / MANIFEST_NAME).open() as handle:
        manifest = json.load(handle)
    if not isinstance(manifest, dict):
        raise ValueError("manifest.json does not hold a JSON object")
    return manifest


def _manifest_problem(path: Path, manifest: dict) -> Optional[str]:
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"manifest format {manifest.get('format')!r} is not {MANIFEST_FORMAT} (written by another version)"
    if manifest.get("step") != step_of(path):
        return f"manifest says step {manifest.get('step')!r} but the directory is {path.name}"
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and {"name", "size", "sha256"} <= f.keys() for f in files):
        return "manifest has no valid file list"
    if DCP_METADATA_NAME not in {f["name"] for f in files}:
        return f"manifest lists no {DCP_METADATA_NAME} (torch.distributed.checkpoint metadata)"
    return None


def _file_problem(path: Path, entry: dict, check_hashes: bool) -> Optional[str]:
    target = path / entry["name"]
    try:
        problem = _size_problem(target, entry)
        if problem is None and check_hashes:
            problem = _hash_problem(target, entry)
    except OSError as error:  # unreadable (permissions, an I/O error): a reason, not a traceback
        return f"file {entry['name']} cannot be read ({error.strerror or error})"
    return problem


_NOT_REGULAR = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
                stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def _size_problem(target: Path, entry: dict) -> Optional[str]:
    try:
        status = target.stat()
    except FileNotFoundError:
        return f"file {entry['name']} is missing"
    if not stat.S_ISREG(status.st_mode):  # never opened: a FIFO would block the reader for ever
        kind = _NOT_REGULAR.get(stat.S_IFMT(status.st_mode), "something else")
        return f"file {entry['name']} is {kind}, not a regular file"
    if status.st_size != entry["size"]:
        kind = "truncated" if status.st_size < entry["size"] else "larger than written"
        return f"file {entry['name']} is {status.st_size} bytes, manifest says {entry['size']} ({kind})"
    return None


def _hash_problem(target: Path, entry: dict) -> Optional[str]:
    digest = sha256_of(target)
    if digest != entry["sha256"]:
        return f"file {entry['name']} has sha256 {digest[:12]}..., manifest says {entry['sha256'][:12]}... (corrupted)"
    return None


def verify_checkpoint(path: PathLike, check_hashes: bool = True) -> tuple[bool, str]:
    """``(True, "ok")`` when the checkpoint is complete and intact, else
    ``(False, reason)`` with the reason prefixed by the directory name.
    ``check_hashes=False`` checks presence and sizes only (cheap); in full,
    the checksums too, and DCP's ``.metadata`` is read as data (an allow-list
    of DCP's own classes: :mod:`trainer.safe_load`), so a pickle that asks to
    run anything is rejected here, before any load."""
    path = Path(path)
    try:
        problem = _checkpoint_problem(path, check_hashes)
    except OSError as error:  # the directory itself cannot be listed or stat-ed
        problem = f"cannot be read ({error.strerror or error})"
    return (False, f"{path.name}: {problem}") if problem else (True, "ok")


def _checkpoint_problem(path: Path, check_hashes: bool) -> Optional[str]:
    if not path.is_dir():
        return "directory does not exist"
    if not (path / MANIFEST_NAME).is_file():
        return f"no {MANIFEST_NAME} (the save did not finish)"
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError) as error:
        return f"{MANIFEST_NAME} cannot be read ({error})"
    problem = _manifest_problem(path, manifest)
    if problem:
        return problem
    for entry in manifest["files"]:
        problem = _file_problem(path, entry, check_hashes)
        if problem:
            return problem
    if not check_hashes:
        return None
    from trainer.safe_load import metadata_problem  # torch: only for a verification in full

    return metadata_problem(path / DCP_METADATA_NAME)


def recorded_shapes(manifest: dict) -> Optional[dict[str, tuple[int, ...]]]:
    """The model's tensor shapes the manifest records, or None when it
    predates :data:`PARAMETERS_FIELD`."""
    shapes = manifest.get(PARAMETERS_FIELD)
    if not isinstance(shapes, dict):
        return None
    return {str(name): tuple(int(n) for n in shape) for name, shape in shapes.items()}


def shape_mismatch(manifest: dict, expected: Mapping[str, Sequence[int]]) -> Optional[str]:
    """One line saying how the model the checkpoint holds differs from
    ``expected`` (``{name: shape}`` of the model the config builds), or None
    when they agree or the manifest records no shapes."""
    saved = recorded_shapes(manifest)
    if saved is None:
        return None
    wanted = {name: tuple(shape) for name, shape in expected.items()}
    # In the model's order, so the first one named is the first a reader meets.
    differences = [f"{name} is {_shape(saved[name])} there, {_shape(shape)} here"
                   for name, shape in wanted.items() if name in saved and saved[name] != shape]
    differences += [f"{name} is not in the checkpoint" for name in wanted if name not in saved]
    differences += [f"{name} is only in the checkpoint" for name in saved if name not in wanted]
    if not differences:
        return None
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    return f"the checkpoint holds a model of another shape than the config builds: {differences[0]}{more}"


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


@dataclass(frozen=True)
class LatestCheckpoint:
    """The newest checkpoint that verifies, and the newer ones that did not."""

    path: Optional[Path]
    """None when no checkpoint verifies."""
    step: Optional[int]
    manifest: Optional[dict]
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of every newer checkpoint that failed, newest first."""


def find_latest_verified(save_dir: PathLike) -> LatestCheckpoint:
    """Walk the checkpoints newest first and return the first that verifies."""
    rejected: list[tuple[str, str]] = []
    for path in reversed(list_checkpoints(save_dir)):
        ok, reason = verify_checkpoint(path)
        if ok:
            return LatestCheckpoint(path=path, step=step_of(path), manifest=read_manifest(path), rejected=rejected)
        rejected.append((str(path), reason))
    return LatestCheckpoint(path=None, step=None, manifest=None, rejected=rejected)


def prune_checkpoints(save_dir: PathLike, keep_last: int, protect: tuple[PathLike, ...] = (),
                      up_to_step: Optional[int] = None) -> list[Path]:
    """Delete checkpoints older than the newest ``keep_last`` complete ones
    (complete = manifest present, files of the right size), never the
    ``protect``-ed ones (the one a run resumed from). Unfinished directories
    older than the newest complete checkpoint are leftovers of crashed saves
    and go too. With ``up_to_step`` (runmgr's driver: the newest checkpoint its
    logbook recorded) only the checkpoints at or before it count and may go;
    newer ones are not looked at. Returns what was deleted."""
    protected = {Path(p).resolve() for p in protect}
    entries = [p for p in list_checkpoints(save_dir) if up_to_step is None or (step_of(p) or 0) <= up_to_step]
    complete = [p for p in entries if verify_checkpoint(p, check_hashes=False)[0]]
    kept = set(complete[-keep_last:])
    newest_complete = (step_of(complete[-1]) or 0) if complete else -1
    deleted = []
    for path in entries:
        if path in kept or path.resolve() in protected or (step_of(path) or 0) >= newest_complete:
            continue
        shutil.rmtree(path)
        deleted.append(path)
    return deleted


def retire_checkpoints_after(save_dir: PathLike, step: int, tag: str) -> list[Path]:
    """Move checkpoints newer than ``step`` to ``<save dir>/retired/`` when a
    run restarts from ``step`` (after a rollback they belong to an abandoned
    branch and must not be mistaken for the latest). They are kept for
    inspection, not deleted; ``tag`` (the sub-run) tells branches apart."""
    moved = []
    for path in list_checkpoints(save_dir):
        if (step_of(path) or 0) > step:
            target = Path(save_dir) / RETIRED_DIR / f"{path.name}.by-{tag}"
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            path.rename(target)
            moved.append(target)
    return moved
