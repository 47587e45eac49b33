"""Huawei ``hccn_tool``: the RoCE NIC of each NPU chip.

``hccn_tool -i N -link -g`` prints ``link status: UP|DOWN``;
``hccn_tool -i N -net_health -g`` prints ``net health status: <state>``.
"""

from __future__ import annotations

import re
from typing import Optional

from health.findings import Finding, fail, ok, warn

_LINK = re.compile(r"link status\s*:\s*(\S+)", re.IGNORECASE)
_NET_HEALTH = re.compile(r"net health status\s*:\s*(.+)", re.IGNORECASE)

# Net-health state -> (is it a failure, what a person should know).
NET_HEALTH_STATES = {
    "success": (False, "the detect IP answers"),
    "socket fail": (True, "a socket to the detect IP could not be opened"),
    "receive timeout": (True, "the detect IP did not answer in time"),
    "unreachable": (True, "the detect IP is unreachable (routing, switch or peer down)"),
    "time exceeded": (True, "packets to the detect IP expired in transit"),
    "fault": (True, "the NIC reports a fault"),
    "init": (False, "the check is still initialising; run it again"),
    "thread error": (True, "the driver's detection thread failed"),
    "detect ip set": (False, "no detect IP is set: configure one with "
                             "hccn_tool -i N -netdetect -s address <ip>"),
    "unknown": (False, "the state is unknown"),
}


def parse_link(text: str) -> Optional[str]:
    """``UP`` / ``DOWN`` (upper case), or None when the answer has no status."""
    match = _LINK.search(text)
    return match.group(1).upper() if match else None


def parse_net_health(text: str) -> Optional[str]:
    """The net-health state as printed (``Success``, ``Receive timeout`` ...)."""
    match = _NET_HEALTH.search(text)
    return match.group(1).strip() if match else None


def link_findings(device: int, status: Optional[str]) -> list[Finding]:
    if status == "UP":
        return [ok("roce.link.up", f"RoCE link of device {device} is UP", device=device)]
    if status == "DOWN":
        return [fail("roce.link.down",
                     f"RoCE link of device {device} is DOWN: check the cable, optics and "
                     f"switch port (hccn_tool -i {device} -link_stat -g shows its history)",
                     device=device, status=status)]
    return [warn("roce.link.unreadable",
                 f"hccn_tool gave no link status for device {device}", device=device)]


def net_health_findings(device: int, state: Optional[str]) -> list[Finding]:
    if state is None:
        return [warn("roce.net_health.unreadable",
                     f"hccn_tool gave no net health status for device {device}", device=device)]
    is_failure, meaning = NET_HEALTH_STATES.get(state.lower(), (False, "unrecognised state"))
    if state.lower() == "success":
        return [ok("roce.net_health.ok", f"device {device} network health: {meaning}",
                   device=device)]
    make = fail if is_failure else warn
    return [make("roce.net_health." + state.lower().replace(" ", "_"),
                 f"device {device} network health is '{state}': {meaning}",
                 device=device, state=state)]
