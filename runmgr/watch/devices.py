"""Device faults from the health poll: bad health, ECC errors, fatal events.

Judged on volatile counters (they reset with the driver), as OPT's health
check did: any uncorrectable error takes the device out; correctable errors
only when there are too many in total or they rise fast (OPT 12.17-12.34:
"high DRAM correctable counts"). Each (device, reason) is reported once until
a reading of the same kind no longer shows it.

A node is read by its agent or by a poller (runmgr/workers/devicepoll.py); at a
handover both may read it for a moment, and their readings reach the detector
by two paths, not in the order they were taken. A health or ECC reading older
than one already taken of the same device says nothing new and is dropped, so a
poller's last healthy reading arriving after the agent's first faulty one does
not clear the fault and have it reported twice.
"""

from __future__ import annotations

from collections import deque
from runmgr.config.watcher import DeviceConfig
from runmgr.watch.incidents import DEVICE_FAULT, Incident
from runmgr.watch.observations import DeviceObservation

Finding = tuple[str, str]  # (reason, description)


class DeviceDetector:
    """Turns health-poll readings into DEVICE_FAULT incidents naming the node."""

    def __init__(self, config: DeviceConfig) -> None:
        self.config = config
        self._reported: set[tuple[str, int, str, str]] = set()  # node, device, reading, reason
        self._counts: dict[tuple[str, int], deque[tuple[float, int]]] = {}
        self._newest: dict[tuple[str, int, str], float] = {}  # node, device, reading -> when last taken

    def update(self, obs: DeviceObservation, now: float) -> list[Incident]:
        """Feed one reading; returns an incident for each new fault reason."""
        if obs.kind != "event" and self._stale(obs):
            return []
        if obs.kind == "health":
            findings = self._health(obs)
        elif obs.kind == "ecc":
            findings = self._ecc(obs)
        elif obs.kind == "event":
            findings = self._event(obs)
        else:
            raise ValueError(f"unknown device reading kind {obs.kind!r}; use health, ecc or event")
        current = {reason for reason, _ in findings}
        if obs.kind != "event":
            # A reason absent from this reading has cleared: it may be reported again later.
            self._reported = {k for k in self._reported
                              if k[:3] != (obs.node, obs.device, obs.kind) or k[3] in current}
        incidents = []
        for reason, description in findings:
            key = (obs.node, obs.device, obs.kind, reason)
            if key in self._reported:
                continue
            self._reported.add(key)
            incidents.append(Incident(
                kind=DEVICE_FAULT, time=now, nodes=(obs.node,),
                description=f"{obs.node} device {obs.device}: {description}",
                evidence={"node": obs.node, "device": obs.device, "reason": reason, "reading": obs.kind,
                          "status": obs.status, "correctable": obs.correctable,
                          "uncorrectable": obs.uncorrectable, "code": obs.code, "message": obs.message},
            ))
        return incidents

    def _stale(self, obs: DeviceObservation) -> bool:
        """Whether a newer reading of the same device and kind was taken already (by another
        reader of the node); otherwise ``obs`` is the newest."""
        key = (obs.node, obs.device, obs.kind)
        if obs.time < self._newest.get(key, float("-inf")):
            return True
        self._newest[key] = obs.time
        return False

    def _health(self, obs: DeviceObservation) -> list[Finding]:
        if obs.status in self.config.fault_statuses:
            return [(f"health_{obs.status.lower()}", f"health is {obs.status}")]
        return []

    def _ecc(self, obs: DeviceObservation) -> list[Finding]:
        cfg = self.config
        findings: list[Finding] = []
        if obs.uncorrectable is not None and obs.uncorrectable > cfg.max_uncorrectable:
            findings.append(("uncorrectable_ecc", f"{obs.uncorrectable} uncorrectable ECC error(s) "
                                                  f"(tolerated {cfg.max_uncorrectable})"))
        if obs.correctable is not None:
            findings.extend(self._correctable(obs, obs.correctable))
        return findings

    def _correctable(self, obs: DeviceObservation, count: int) -> list[Finding]:
        cfg = self.config
        history = self._counts.setdefault((obs.node, obs.device), deque())
        if history and count < history[-1][1]:
            history.clear()  # volatile counters reset with the driver: a fresh start
        history.append((obs.time, count))
        while history and obs.time - history[0][0] > cfg.rise_window_s:
            history.popleft()
        findings: list[Finding] = []
        if count > cfg.max_correctable:
            findings.append(("correctable_ecc_total", f"{count} correctable ECC errors "
                                                      f"(tolerated {cfg.max_correctable})"))
        rise = count - history[0][1]
        if rise >= cfg.correctable_rise:
            span = obs.time - history[0][0]
            findings.append(("correctable_ecc_rising", f"correctable ECC errors rose by {rise} in {span:.0f} s "
                                                       f"(limit {cfg.correctable_rise} in {cfg.rise_window_s:.0f} s)"))
        return findings

    def _event(self, obs: DeviceObservation) -> list[Finding]:
        if obs.code is not None and obs.code in self.config.fatal_event_codes:
            label = f"Xid {obs.code}" if obs.code < 1000 else f"error code {obs.code}"
            detail = f": {obs.message}" if obs.message else ""
            return [(f"event_{obs.code}", f"fatal event {label}{detail}")]
        return []

