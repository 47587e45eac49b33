"""The watcher's device input: what one poll of a node's vendor tools
printed, turned into :class:`~runmgr.watch.observations.DeviceObservation`
values (health and ECC counters, NVIDIA Xid events).

Pure: the tools are run by the caller's ``run`` (the mid-run poll's actor,
runmgr/workers/devicepoll.py, runs them bounded on each node) and read here by
name (``npu-smi``, ``nvidia-smi``, ``dmesg``) with the pure text parsers of
:mod:`health.parsers`. A node without the tools yields nothing; a tool that
hangs or fails yields an ``UNKNOWN`` health reading that names it.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence

from health.parsers import npu_smi, nvidia_smi, xid
from runmgr.watch.observations import DeviceObservation


class ToolAnswer(Protocol):
    """What came back from one vendor-tool call (health.probes.bounded.CommandResult)."""

    status: str
    """ok, failed, timeout, or absent (the tool is not installed)."""
    returncode: Optional[int]
    stdout: str

    @property
    def output(self) -> str: ...

    @property
    def command(self) -> str: ...


Runner = Callable[[str, Sequence[str]], ToolAnswer]
"""Runs a vendor tool by name with its arguments and returns its answer."""
_HEALTH_ORDER = {"ok": 0, "warning": 1, "unknown": 2, "alarm": 3, "critical": 4}
_SINCE_BOOT_EXCLUDES = ("aggregate", "isolated", "total")


def tool_trouble(node: str, result: ToolAnswer, now: float) -> DeviceObservation:
    """A tool that timed out or failed: the device state is unknown."""
    what = ("did not answer within its timeout" if result.status == "timeout"
            else f"exited with {result.returncode}: {result.output.strip()[:160]}")
    return DeviceObservation(node=node, device=-1, kind="health", time=now, status="UNKNOWN",
                             message=f"`{result.command}` {what}")


def _worst(words: Sequence[str]) -> str:
    return max(words, key=lambda w: _HEALTH_ORDER.get(w.lower(), 2))


def _since_boot(ecc: npu_smi.NpuEcc, kind: str) -> Optional[int]:
    counts = ecc.matching(kind, exclude=_SINCE_BOOT_EXCLUDES)
    return sum(counts.values()) if counts else None


def npu_readings(run: Runner, node: str, now: float) -> list[DeviceObservation]:
    """Per NPU: the worst health of its chips, and its since-boot ECC counts."""
    info = run("npu-smi", ["info"])
    if info.status == "absent":
        return []
    if info.status != "ok":
        return [tool_trouble(node, info, now)]
    chips = npu_smi.parse_info(info.stdout).chips
    readings = []
    for npu_id in sorted({c.npu_id for c in chips}):
        states = [c.health for c in chips if c.npu_id == npu_id]
        readings.append(DeviceObservation(node=node, device=npu_id, kind="health", time=now,
                                          status=_worst(states), message=" ".join(states)))
        ecc = run("npu-smi", ["info", "-t", "ecc", "-i", str(npu_id)])
        if ecc.status != "ok":
            readings.append(tool_trouble(node, ecc, now))
            continue
        counts = npu_smi.parse_ecc(ecc.stdout)
        readings.append(DeviceObservation(
            node=node, device=npu_id, kind="ecc", time=now,
            correctable=_since_boot(counts, "single bit"),
            uncorrectable=_since_boot(counts, "double bit")))
    return readings


def _bus_key(bus_id: str) -> str:
    """``00000000:2B:00.0`` and ``0000:2b:00`` -> ``2b:00``: bus and device."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


def nvidia_readings(run: Runner, node: str, now: float, read_kernel_log: bool = True
                    ) -> list[DeviceObservation]:
    """Per GPU: volatile ECC counts; per Xid line in the kernel log: an event."""
    query = run("nvidia-smi", ["-q", "-d", "ECC"])
    if query.status == "absent":
        return []
    if query.status == "timeout":
        return [tool_trouble(node, query, now)]
    _, gpus = nvidia_smi.parse_query(query.stdout)
    readings = []
    for index, gpu in enumerate(gpus):
        ecc = nvidia_smi.ecc_from_query(gpu)
        readings.append(DeviceObservation(node=node, device=index, kind="ecc", time=now,
                                          correctable=ecc.volatile_correctable,
                                          uncorrectable=ecc.volatile_uncorrectable))
    if read_kernel_log:
        readings += xid_readings(run, node, now, [g.bus_id for g in gpus])
    return readings


def xid_readings(run: Runner, node: str, now: float, bus_ids: Sequence[str]) -> list[DeviceObservation]:
    log = run("dmesg", [])
    if log.status != "ok":
        return []  # unreadable kernel log: the pre-flight check already warned about it
    index = {_bus_key(bus): i for i, bus in enumerate(bus_ids)}
    return [DeviceObservation(node=node, device=index.get(_bus_key(event.pci), -1), kind="event",
                              time=now, code=event.code, message=event.message)
            for event in xid.parse_xid(log.stdout)]


def read_devices(node: str, run: Runner, now: float, read_kernel_log: bool = True
                 ) -> list[DeviceObservation]:
    """Everything one poll of this node sees."""
    return npu_readings(run, node, now) + nvidia_readings(run, node, now, read_kernel_log)
