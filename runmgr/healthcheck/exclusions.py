"""The exclusions of every check, with their history, where ``runmgr launch``
reads them: ``<runs root>/.health/exclusions.jsonl``, one line per check.

Append-only: a line is written whole and fsynced under a file lock, so a
crash loses no earlier check; a torn last line (a crash mid-write) is ignored.
A machine excluded in ``LEMON_CHECKS`` different checks is a lemon: it keeps
coming back broken and should be repaired or replaced, not just rebooted.

``runmgr health-check --readmit NODE`` (and a passing ``--recheck-self``)
appends a line of source ``readmit`` that admits the machine's current
exclusions: the latest verdict decides, so ``runmgr launch`` uses it again,
and the history (lemons included) keeps every earlier exclusion.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

STORE_DIR = ".health"
EXCLUSIONS_FILE = "exclusions.jsonl"
REPORTS_DIR = "reports"
LEMON_CHECKS = 3


@dataclass(frozen=True)
class NodeRecord:
    """One node's verdict in one check."""

    node_id: str
    key: str
    """What the history is kept under (``host:NAME`` or ``ray:ID``, see nodes.history_keys)."""
    display: str
    verdict: str
    reasons: tuple[str, ...] = ()
    k8s_node: Optional[str] = None


@dataclass(frozen=True)
class CheckRecord:
    """One check's verdicts, as stored."""

    check_id: str
    time: float
    source: str
    """``health-check``, ``launch`` or ``readmit`` (a person's --readmit, a passing --recheck-self)."""
    nodes: tuple[NodeRecord, ...] = ()
    report: Optional[str] = None
    """Where the full JSON report was written."""

    @property
    def excluded(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.verdict == "exclude"]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping) -> "CheckRecord":
        nodes = tuple(NodeRecord(**{**n, "reasons": tuple(n.get("reasons", ()))})
                      for n in data.get("nodes", ()))
        return cls(str(data["check_id"]), float(data["time"]), str(data["source"]), nodes,
                   data.get("report"))


@dataclass(frozen=True)
class Lemon:
    """A machine excluded again and again."""

    key: str
    display: str
    checks: tuple[str, ...] = field(default_factory=tuple)
    """Ids of the checks that excluded it, oldest first."""
    first_time: float = 0.0

    @property
    def count(self) -> int:
        return len(self.checks)

    def note(self) -> str:
        return (f"LEMON: excluded in {self.count} checks (first {self.checks[0]}): this machine "
                "keeps failing; repair or replace it rather than reboot it")


class ExclusionStore:
    """Reads and appends ``exclusions.jsonl`` in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    @classmethod
    def for_runs_root(cls, runs_root: Path) -> "ExclusionStore":
        return cls(Path(runs_root) / STORE_DIR)

    @property
    def path(self) -> Path:
        return self.directory / EXCLUSIONS_FILE

    def record(self, check: CheckRecord) -> None:
        """Append one check, durably."""
        self.directory.mkdir(parents=True, exist_ok=True)
        line = (check.to_json() + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._end_torn_line(fd)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _end_torn_line(self, fd: int) -> None:
        # A crash mid-write can leave a last line without its newline: end it so
        # that the new record starts on a line of its own (the torn one is skipped).
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")

    def checks(self) -> list[CheckRecord]:
        """Every stored check, oldest first."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        records = []
        for line in lines:
            try:
                records.append(CheckRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # blank, or torn by a crash mid-write: that check never completed
        return records

    def latest_verdicts(self) -> dict[str, NodeRecord]:
        """History key -> the node's verdict in the last check that saw it."""
        latest: dict[str, NodeRecord] = {}
        for check in self.checks():
            for node in check.nodes:
                latest[node.key] = node
        return latest

    def current_exclusions(self) -> dict[str, NodeRecord]:
        """History key -> record, for machines the last check that saw them excluded."""
        return {k: n for k, n in self.latest_verdicts().items() if n.verdict == "exclude"}

    def exclusions_of(self, name: str) -> list[NodeRecord]:
        """The current exclusions of the machine called ``name``: records whose Kubernetes
        node is ``name`` or whose host name is (the first word of a node's display name:
        every Ray node of that host)."""
        return [record for record in self.current_exclusions().values()
                if record.k8s_node == name or record.display.split(" ", 1)[0] == name]

    def readmit(self, names: Sequence[str], check_id: str, time: float,
                source: str = "readmit") -> dict[str, list[NodeRecord]]:
        """Admit the current exclusions of the machines ``names`` (one appended line, none
        when nothing matched); name -> the exclusions it cleared."""
        cleared = {name: self.exclusions_of(name) for name in names}
        admitted = {r.key: replace(r, verdict="admit", reasons=()) for found in cleared.values() for r in found}
        if admitted:
            self.record(CheckRecord(check_id, time, source, tuple(admitted.values())))
        return cleared

    def lemons(self, threshold: int = LEMON_CHECKS) -> dict[str, Lemon]:
        """Machines excluded in at least ``threshold`` different checks."""
        seen: dict[str, list[tuple[str, float, str]]] = {}
        for check in self.checks():
            for node in check.excluded:
                seen.setdefault(node.key, []).append((check.check_id, check.time, node.display))
        return {key: Lemon(key, hits[-1][2], tuple(h[0] for h in hits), hits[0][1])
                for key, hits in seen.items() if len(hits) >= threshold}

    def save_report(self, check_id: str, report: dict) -> Path:
        """Write a check's full JSON report atomically; returns its path."""
        return write_json_atomically(self.directory / REPORTS_DIR / f"{check_id}.json", report)


def write_json_atomically(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for everyone who runs jobs
    os.replace(tmp, path)
    return path


def node_records(entries: Iterable[Mapping]) -> tuple[NodeRecord, ...]:
    """Records from the ``nodes`` entries of a JSON report (see summary.build_report)."""
    return tuple(NodeRecord(e["node"], e["history_key"], e["display"], e["verdict"],
                            tuple(e["reasons"]), e.get("k8s_node")) for e in entries)
