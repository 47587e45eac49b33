"""Huawei Ascend ``npu-smi``: the ``info`` table (910B and two-chip A3 layouts),
``info -t health -i N`` and ``info -t ecc -i N``.

Health words come from the driver (OK, Warning, Alarm, Critical, UNKNOWN); the
most severe active alarm wins. ECC counts without "Aggregate" reset at reboot,
the aggregate ones are lifetime counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from health.findings import Finding, Severity, fail, ok, warn
from health.parsers.text import split_key_value, to_float, to_int

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_USAGE_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION = re.compile(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)")

# Driver health word -> (severity, what it means for a person).
HEALTH_WORDS = {
    "ok": (Severity.OK, "healthy"),
    "warning": (Severity.WARN, "a minor alarm is active"),
    "alarm": (Severity.FAIL, "a major alarm is active"),
    "critical": (Severity.FAIL, "a critical alarm is active"),
    "unknown": (Severity.FAIL, "the driver cannot read this NPU's health"),
}


@dataclass(frozen=True)
class NpuChip:
    """One chip row pair of the ``npu-smi info`` table."""

    npu_id: int
    chip_id: int
    phy_id: Optional[int]
    """Physical chip id (A3 layout only)."""
    name: str
    health: str
    bus_id: str
    power_w: Optional[float]
    temp_c: Optional[float]
    aicore_pct: Optional[float]
    hbm_used_mb: Optional[int]
    hbm_total_mb: Optional[int]


@dataclass(frozen=True)
class NpuInventory:
    """The whole ``npu-smi info`` table."""

    version: Optional[str]
    chips: tuple[NpuChip, ...]

    @property
    def npu_ids(self) -> list[int]:
        return sorted({chip.npu_id for chip in self.chips})


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _name_row(cells: list[str]) -> Optional[tuple[int, str, str, list[str]]]:
    first = cells[0].split()
    if len(first) < 2 or not first[0].isdigit() or _BUS_ID.match(cells[1]):
        return None
    if not cells[1] or not cells[1].split()[0].isalpha():
        return None  # a process row (pid in the second cell), not a device row
    return int(first[0]), " ".join(first[1:]), cells[1], cells[2].split()


def _chip(name_row: tuple[int, str, str, list[str]], cells: list[str]) -> NpuChip:
    npu_id, name, health, figures = name_row
    ids = cells[0].split()
    pairs = _USAGE_PAIR.findall(cells[2])
    hbm = pairs[-1] if pairs else (None, None)
    aicore = cells[2].split()[0] if cells[2].split() else None
    return NpuChip(
        npu_id=npu_id,
        chip_id=int(ids[0]) if ids and ids[0].isdigit() else 0,
        phy_id=int(ids[1]) if len(ids) > 1 and ids[1].isdigit() else None,
        name=name,
        health=health,
        bus_id=cells[1],
        power_w=to_float(figures[0]) if figures else None,
        temp_c=to_float(figures[1]) if len(figures) > 1 else None,
        aicore_pct=to_float(aicore),
        hbm_used_mb=int(hbm[0]) if hbm[0] is not None else None,
        hbm_total_mb=int(hbm[1]) if hbm[1] is not None else None,
    )


def parse_info(text: str) -> NpuInventory:
    """Parse ``npu-smi info``. Each chip is a name row (NPU id, name, health,
    power, temperature) followed by a chip row (chip id [, phy id], bus id,
    usage). The process table that follows is ignored."""
    version_match = _VERSION.search(text)
    chips: list[NpuChip] = []
    pending = None
    for line in text.splitlines():
        if not line.strip().startswith("|"):
            continue
        cells = _cells(line)
        if any("Process id" in cell for cell in cells):
            break
        if len(cells) < 3:
            continue
        if pending is not None and _BUS_ID.match(cells[1]):
            chips.append(_chip(pending, cells))
            pending = None
            continue
        pending = _name_row(cells) or pending
    return NpuInventory(version_match.group(2) if version_match else None, tuple(chips))


def health_severity(word: str) -> tuple[Severity, str]:
    return HEALTH_WORDS.get(word.strip().lower(), (Severity.WARN, f"unrecognised state {word!r}"))


def info_findings(inventory: NpuInventory) -> list[Finding]:
    """One finding per chip that is not OK, or one ok finding for the lot."""
    findings = []
    for chip in inventory.chips:
        severity, meaning = health_severity(chip.health)
        if severity is Severity.OK:
            continue
        where = f"NPU {chip.npu_id} chip {chip.chip_id} ({chip.bus_id})"
        findings.append(Finding(
            severity, f"npu.health.{chip.health.lower()}",
            f"{where} reports health {chip.health}: {meaning} "
            f"(details: npu-smi info -t health -i {chip.npu_id})",
            {"npu": chip.npu_id, "chip": chip.chip_id, "bus_id": chip.bus_id,
             "health": chip.health}))
    if not findings:
        findings.append(ok("npu.health.ok",
                           f"{len(inventory.chips)} NPU chips on {len(inventory.npu_ids)} NPUs, "
                           "all health OK", chips=len(inventory.chips)))
    return findings


def _kv_records(text: str) -> list[dict[str, str]]:
    """``key : value`` lines grouped into records; a repeated key starts a new
    record (several chips in one answer). Lines without a key continue the
    previous value (multi-line Error Information)."""
    records: list[dict[str, str]] = [{}]
    last_key = None
    for line in text.splitlines():
        if not line.strip():
            continue
        pair = split_key_value(line)
        if pair is None:
            if last_key is not None:
                records[-1][last_key] += "\n" + line.strip()
            continue
        key, value = pair[0].lower().replace("-", " "), pair[1]
        if key in records[-1]:
            records.append({})
        records[-1][key] = value
        last_key = key
    return [record for record in records if record]


@dataclass(frozen=True)
class NpuHealthDetail:
    """``npu-smi info -t health``: the state and its error codes for one chip."""

    npu_id: Optional[int]
    chip: Optional[str]
    health: str
    error_codes: tuple[str, ...] = ()
    error_info: tuple[str, ...] = ()


def parse_health(text: str) -> list[NpuHealthDetail]:
    """Parse ``npu-smi info -t health -i N [-c C]`` (``Health`` or ``Health Status``)."""
    details = []
    npu_id = None
    for record in _kv_records(text):
        npu_id = to_int(record.get("npu id")) if "npu id" in record else npu_id
        health = record.get("health", record.get("health status"))
        if health is None:
            continue
        codes = record.get("error code", "NA").split()
        info = [ln for ln in record.get("error information", "NA").splitlines() if ln]
        details.append(NpuHealthDetail(
            npu_id=npu_id,
            chip=record.get("chip name", record.get("chip id")),
            health=health,
            error_codes=tuple(c for c in codes if c.upper() != "NA"),
            error_info=tuple(i for i in info if i.upper() != "NA"),
        ))
    return details


def health_findings(details: list[NpuHealthDetail], npu_id: int) -> list[Finding]:
    findings = []
    for detail in details:
        severity, meaning = health_severity(detail.health)
        if severity is Severity.OK:
            continue
        chip = f" chip {detail.chip}" if detail.chip else ""
        codes = " ".join(detail.error_codes) or "none"
        info = "; ".join(detail.error_info) or "no description"
        findings.append(Finding(
            severity, f"npu.health.{detail.health.lower()}",
            f"NPU {npu_id}{chip} is {detail.health} ({meaning}): error codes {codes}: {info}",
            {"npu": npu_id, "health": detail.health, "error_codes": codes}))
    return findings


@dataclass
class NpuEcc:
    """ECC counters of one NPU, per memory (HBM, DDR) and kind."""

    npu_id: Optional[int]
    counts: dict[str, Optional[int]] = field(default_factory=dict)
    """Normalised key (``hbm double bit error count``) -> count."""

    def matching(self, *words: str, exclude: tuple[str, ...] = ()) -> dict[str, int]:
        return {k: v for k, v in self.counts.items()
                if v is not None and all(w in k for w in words)
                and not any(x in k for x in exclude)}


def parse_ecc(text: str) -> NpuEcc:
    """Parse ``npu-smi info -t ecc -i N`` (910B with DDR+HBM lines, 950 with
    Next-Isolated lines, 200I A2 with ``Double-bit Error Count``)."""
    counts: dict[str, Optional[int]] = {}
    npu_id = None
    for record in _kv_records(text):
        for key, value in record.items():
            if key == "npu id":
                npu_id = to_int(value)
            elif "count" in key or "cnt" in key:
                number = to_int(value)
                if key in counts and number is not None:
                    number = max(number, counts[key] or 0)  # several chips: keep the worst
                counts[key] = number
    return NpuEcc(npu_id, counts)


def ecc_findings(ecc: NpuEcc, npu_id: int, correctable_warn: int,
                 uncorrectable_fail: int) -> list[Finding]:
    """Double-bit (uncorrectable) errors since boot fail the node; lifetime ones,
    pages waiting for isolation and many single-bit errors warn."""
    findings = []
    lifetime = ("aggregate", "isolated", "total")
    for key, count in ecc.matching("double bit", exclude=lifetime).items():
        if count > uncorrectable_fail:
            findings.append(fail(
                "npu.ecc.double_bit",
                f"NPU {npu_id}: {count} uncorrectable (double-bit) ECC errors since boot "
                f"({key}): memory is corrupt, drain the node and reboot it, replace the "
                "NPU if they return", npu=npu_id, counter=key, count=count))
    failing_now = bool(findings)
    for key, count in ecc.matching("double bit", "aggregate").items():
        if count > 0 and not failing_now:  # the since-boot finding already says it
            findings.append(warn(
                "npu.ecc.double_bit_lifetime",
                f"NPU {npu_id} has {count} double-bit ECC errors in its lifetime ({key}); "
                "watch it", npu=npu_id, counter=key, count=count))
    for key, count in ecc.matching("next isolated").items():
        if count > 0:
            findings.append(warn(
                "npu.ecc.pages_pending",
                f"NPU {npu_id}: {count} memory pages wait to be isolated ({key}); "
                "reboot the node to isolate them", npu=npu_id, counter=key, count=count))
    for key, count in ecc.matching("single bit", exclude=lifetime).items():
        if count > correctable_warn:
            findings.append(warn(
                "npu.ecc.single_bit_high",
                f"NPU {npu_id}: {count} correctable ECC errors since boot ({key}), above "
                f"{correctable_warn}: memory is degrading", npu=npu_id, counter=key, count=count))
    return findings
