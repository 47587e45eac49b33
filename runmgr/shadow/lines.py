"""The lines of a live training log as they are written: one file, a folder of per-rank
files, or a stream (standard input: ``kubectl logs -f job/x | runmgr watch follow -``).

Each ``take()`` returns the complete lines written since the last one, each with the time it
was read (the job's own clock is not trusted to agree with ours). A file that is truncated
(``copytruncate`` rotation, a job that reopens its log with ``>``) is read again from its start;
a file that is replaced (``logrotate``'s rename and create: another inode at the path) is read
to its end first, then the new one from its start. A line still being written (no newline yet)
waits for its end.

Where a file source stands (:meth:`position`) is plain data, saved by the follower after what
it read is in the logbook, so that a restarted follower goes on from there
(:meth:`restore`). A stream cannot be re-read: a restarted follower of standard input goes on
with what the pipe brings next.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, TextIO

READ_CHUNK = 1 << 20
"""Bytes read from a file at a time: a log written at thousands of lines a second is read in a few calls."""
MAX_LINE = 1 << 20
"""A line longer than this (no newline within a MiB) is cut there: a job printing binary must not
grow the follower's memory without bound."""

Line = tuple[float, str]
"""(when it was read, the line without its newline)."""


class LineSource(Protocol):
    """Where a followed log's lines come from."""

    def take(self) -> list[Line]:
        """The complete lines written since the last call, in order."""

    def position(self) -> dict:
        """Where the source stands, as plain data (:meth:`restore` takes it back)."""

    def restore(self, position: dict) -> None:
        """Go on from a saved :meth:`position`."""

    def describe(self) -> str:
        """The source in a few words, for the logbook."""


@dataclass
class _Cursor:
    """How far one file was read: its inode (to see a replacement) and the offset of the first
    byte not yet taken as a complete line."""

    inode: Optional[int] = None
    offset: int = 0


class FileLines:
    """The lines appended to one file, through truncation and rotation."""

    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        self.path = path
        self.clock = clock
        self._cursor = _Cursor()

    def take(self) -> list[Line]:
        stat = self._stat()
        lines: list[Line] = []
        if stat is None:  # not there (yet, or between a rotation's rename and create)
            return lines
        if self._cursor.inode is not None and stat.st_ino != self._cursor.inode:
            lines += self._rest_of_replaced()
            self._cursor = _Cursor(stat.st_ino, 0)
        if self._cursor.inode is None:
            self._cursor.inode = stat.st_ino
        if stat.st_size < self._cursor.offset:  # truncated: the new content starts at 0
            self._cursor.offset = 0
        lines += self._read_from(self.path)
        return lines

    def _stat(self) -> Optional[os.stat_result]:
        try:
            return self.path.stat()
        except FileNotFoundError:
            return None

    def _rest_of_replaced(self) -> list[Line]:
        """What was written to the old file after the last read: still open under its new name
        only if the rotation kept it; the old inode is gone from the path, so it is read through
        the folder's other names for it (logrotate's ``NAME.1``)."""
        for sibling in sorted(self.path.parent.glob(self.path.name + "*")):
            try:
                if sibling != self.path and sibling.stat().st_ino == self._cursor.inode:
                    return self._read_from(sibling)
            except FileNotFoundError:
                continue
        return []

    def _read_from(self, path: Path) -> list[Line]:
        try:
            with path.open("rb") as handle:
                handle.seek(self._cursor.offset)
                data = handle.read(READ_CHUNK)
                chunks = []
                while data:
                    chunks.append(data)
                    data = handle.read(READ_CHUNK)
        except FileNotFoundError:
            return []
        return self._complete_lines(b"".join(chunks))

    def _complete_lines(self, data: bytes) -> list[Line]:
        """The complete lines of ``data`` (read from the cursor on); the cursor moves past them. An
        unfinished last line is read again, whole, next time."""
        if not data:
            return []
        now = self.clock()
        *complete, rest = data.split(b"\n")
        consumed = len(data) - len(rest)
        if len(rest) > MAX_LINE:  # a line without end: taken as it is, cut
            complete.append(rest[:MAX_LINE])
            consumed = len(data)
        self._cursor.offset += consumed
        return [(now, raw.decode("utf-8", errors="replace").rstrip("\r")) for raw in complete]

    def position(self) -> dict:
        return {"path": str(self.path), "inode": self._cursor.inode, "offset": self._cursor.offset}

    def restore(self, position: dict) -> None:
        stat = self._stat()
        if stat is None or stat.st_ino != position.get("inode") or stat.st_size < position.get("offset", 0):
            # Replaced or truncated while the follower was down: what it holds now is new.
            self._cursor = _Cursor(stat.st_ino if stat is not None else None, 0)
            return
        self._cursor = _Cursor(position["inode"], int(position["offset"]))

    def describe(self) -> str:
        return str(self.path)


class FolderLines:
    """The lines of every file in a folder (one log per rank or per node), each followed as
    :class:`FileLines`; a file that appears later is followed from its start. Lines of one
    take are ordered by file name, then by their order in the file."""

    def __init__(self, folder: Path, clock: Callable[[], float], pattern: str = "*") -> None:
        self.folder = folder
        self.clock = clock
        self.pattern = pattern
        self._files: dict[str, FileLines] = {}

    def take(self) -> list[Line]:
        for path in sorted(self.folder.glob(self.pattern)):
            if path.is_file() and not _rotated_copy(path) and path.name not in self._files:
                self._files[path.name] = FileLines(path, self.clock)
        lines: list[Line] = []
        for name in sorted(self._files):
            lines += self._files[name].take()
        return lines

    def position(self) -> dict:
        return {"files": {name: source.position() for name, source in self._files.items()}}

    def restore(self, position: dict) -> None:
        for name, saved in position.get("files", {}).items():
            source = FileLines(self.folder / name, self.clock)
            source.restore(saved)
            self._files[name] = source

    def describe(self) -> str:
        return f"{self.folder}/ ({len(self._files)} files)"


def _rotated_copy(path: Path) -> bool:
    """``train.log.1``, ``train.log.2.gz``: a rotation's old copy, already read as its live file."""
    parts = path.name.split(".")
    return len(parts) > 2 and (parts[-1].isdigit() or (parts[-1] == "gz" and parts[-2].isdigit()))


class StreamLines:
    """The lines of a stream (standard input), read by a thread so that a silent pipe never
    stops the follower from judging the silence. ``ended`` once the stream is closed."""

    def __init__(self, stream: TextIO, clock: Callable[[], float], name: str = "standard input") -> None:
        self.clock = clock
        self.name = name
        self._queue: queue.SimpleQueue[Line] = queue.SimpleQueue()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), name="follow-stdin", daemon=True)
        self._thread.start()

    def _read(self, stream: TextIO) -> None:
        try:
            for line in stream:
                self._queue.put((self.clock(), line.rstrip("\r\n")[:MAX_LINE]))
        finally:
            self._ended.set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set() and self._queue.empty()

    def take(self) -> list[Line]:
        lines: list[Line] = []
        while True:
            try:
                lines.append(self._queue.get_nowait())
            except queue.Empty:
                return lines

    def position(self) -> dict:
        return {"stream": self.name}

    def restore(self, position: dict) -> None:
        """A pipe cannot be re-read: the follower goes on with what it brings next."""

    def describe(self) -> str:
        return self.name


def open_source(where: str, clock: Callable[[], float], stdin: TextIO) -> LineSource:
    """``-``: standard input; a folder: its files; else the file (which may not exist yet: a job
    about to start). A missing folder above the file is the caller's one-line refusal."""
    if where == "-":
        return StreamLines(stdin, clock)
    path = Path(where)
    if path.is_dir():
        return FolderLines(path, clock)
    return FileLines(path, clock)
