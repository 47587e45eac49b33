"""NVIDIA Xid events in the kernel log (``dmesg``, journald, syslog).

``NVRM: Xid (PCI:0000:2b:00): 79, pid=..., name=..., GPU has fallen off the bus.``
Older drivers omit ``pid=``/``name=`` and may drop the ``PCI:`` prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from health.findings import Finding, Severity

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+),\s*"
    r"(?:pid=(?P<pid>[^,]*),\s*)?(?:name=(?P<name>[^,]*),\s*)?(?P<message>.*)$"
)

# Xid -> (severity, meaning and action for a person). Codes 48-95 from NVIDIA's
# documentation as collected in FORMATS.md; the others from the Xid catalog.
XID_MEANINGS: dict[int, tuple[Severity, str]] = {
    13: (Severity.WARN, "graphics engine exception, usually an application bug"),
    31: (Severity.WARN, "GPU memory page fault, usually an application bug"),
    43: (Severity.WARN, "GPU stopped processing (the application hit an error)"),
    45: (Severity.WARN, "preemptive cleanup after an earlier error"),
    48: (Severity.FAIL, "double-bit (uncorrectable) ECC error: drain the node and reset the GPU"),
    63: (Severity.WARN, "ECC page retirement or row remap recorded: reset the GPU to activate it"),
    64: (Severity.FAIL, "ECC page retirement or row remap FAILED: drain the node; RMA the GPU "
                        "if it repeats after a reboot"),
    74: (Severity.FAIL, "NVLink error: check the links (nvidia-smi nvlink -e) and reset the GPU"),
    79: (Severity.FAIL, "GPU has fallen off the bus: drain the node and reboot it"),
    92: (Severity.WARN, "high single-bit ECC error rate"),
    94: (Severity.WARN, "contained ECC error: the application must restart, no GPU reset needed"),
    95: (Severity.FAIL, "uncontained ECC error: drain the node and reset the GPU"),
    119: (Severity.FAIL, "GSP firmware timeout: reset the GPU"),
    120: (Severity.FAIL, "GSP firmware error: reset the GPU"),
    154: (Severity.FAIL, "GPU recovery action required (see the message): drain the node"),
}
_UNKNOWN = (Severity.WARN, "an Xid runmgr does not know; look it up in NVIDIA's Xid catalog")


@dataclass(frozen=True)
class XidEvent:
    """One Xid line."""

    code: int
    pci: str
    pid: Optional[str]
    process: Optional[str]
    message: str
    line: str


def parse_xid(text: str) -> list[XidEvent]:
    """Every Xid line of a kernel log, in order; other lines are ignored."""
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            events.append(XidEvent(
                code=int(match.group("code")),
                pci=match.group("pci"),
                pid=match.group("pid"),
                process=match.group("name"),
                message=match.group("message").strip(),
                line=line.strip(),
            ))
    return events


def xid_findings(events: list[XidEvent]) -> list[Finding]:
    """One finding per (GPU, Xid) pair, with the count and the latest line."""
    grouped: dict[tuple[str, int], list[XidEvent]] = {}
    for event in events:
        grouped.setdefault((event.pci, event.code), []).append(event)
    findings = []
    for (pci, code), group in grouped.items():
        severity, meaning = XID_MEANINGS.get(code, _UNKNOWN)
        times = f" ({len(group)} times)" if len(group) > 1 else ""
        findings.append(Finding(
            severity, f"gpu.xid.{code}",
            f"GPU {pci}: Xid {code}{times}: {meaning}",
            {"pci": pci, "xid": code, "count": len(group), "last_line": group[-1].line}))
    return findings
