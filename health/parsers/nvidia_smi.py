"""NVIDIA ``nvidia-smi``: ``-q -d ECC`` (Ampere-and-later SRAM/DRAM counters and
the older single/double-bit layout; volatile vs aggregate; retired pages;
remapped rows; the channel/TPC repair flags of recent drivers), the driver's
``GPU Recovery Action``, the ``--query-gpu`` / ``--query-remapped-rows`` CSV,
and the error texts the tool prints when a GPU or the driver is gone.

Judgement follows OPT's health check: any volatile uncorrectable error drains
the node; many correctable errors only warn; ``N/A`` counts are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Union

from health.findings import Finding, fail, warn
from health.parsers.text import NOT_AVAILABLE, split_key_value, to_bool, to_float, to_int

Tree = dict[str, Union[str, "Tree"]]
_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]\s*$")


@dataclass
class GpuQuery:
    """One ``GPU <bus id>`` section of ``nvidia-smi -q`` as a nested tree."""

    bus_id: str
    tree: Tree = field(default_factory=dict)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def parse_query(text: str) -> tuple[dict[str, str], list[GpuQuery]]:
    """Parse ``nvidia-smi -q [-d ...]`` into (header fields, GPU sections).

    Sections are lines without a value; their children are the lines indented
    deeper, so a key such as ``Pending`` is read in its own section.
    """
    header: dict[str, str] = {}
    gpus: list[GpuQuery] = []
    stack: list[tuple[int, Tree]] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip().startswith("="):
            continue
        gpu = _GPU_HEADER.match(line)
        if gpu:
            gpus.append(GpuQuery(gpu.group(1)))
            stack = [(-1, gpus[-1].tree)]
            continue
        pair = split_key_value(line)
        if not stack:
            if pair:
                header[pair[0]] = pair[1]
            continue
        depth = _indent(line)
        while len(stack) > 1 and stack[-1][0] >= depth:
            stack.pop()
        parent = stack[-1][1]
        if pair:
            parent[pair[0]] = pair[1]
        else:
            child: Tree = {}
            parent[line.strip()] = child
            stack.append((depth, child))
    return header, gpus


@dataclass(frozen=True)
class GpuEcc:
    """ECC state of one GPU, whichever layout it came from. None = not reported."""

    bus_id: str
    ecc_enabled: Optional[bool] = None
    volatile_correctable: Optional[int] = None
    volatile_uncorrectable: Optional[int] = None
    aggregate_correctable: Optional[int] = None
    aggregate_uncorrectable: Optional[int] = None
    sram_threshold_exceeded: Optional[bool] = None
    retired_pending: Optional[bool] = None
    remap_pending: Optional[bool] = None
    remap_failure: Optional[bool] = None
    remapped_uncorrectable: Optional[int] = None
    repair_pending: Optional[bool] = None
    """A channel or TPC repair waits for the next GPU reset (driver 550 and later)."""
    unrepairable_memory: Optional[bool] = None
    """The GPU found memory it can neither remap nor repair (driver 550 and later)."""


def _sum(values: list[Optional[int]]) -> Optional[int]:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _leaf_counts(block: Tree, words: str, skip: str = "") -> Optional[int]:
    return _sum([to_int(v) for k, v in block.items() if isinstance(v, str)
                 and words in k.lower() and not (skip and skip in k.lower())])


def _bit_total(block: object) -> Optional[int]:
    """Older layout: a ``Single Bit`` / ``Double Bit`` block with per-unit lines
    and a ``Total``; the total is used when reported, else the units' sum."""
    if not isinstance(block, dict):
        return None
    total = to_int(block.get("Total")) if isinstance(block.get("Total"), str) else None
    if total is not None:
        return total
    return _sum([to_int(v) for k, v in block.items() if isinstance(v, str) and k != "Total"])


def _correctable_uncorrectable(block: object) -> tuple[Optional[int], Optional[int]]:
    if not isinstance(block, dict):
        return None, None
    if "Single Bit" in block or "Double Bit" in block:
        return _bit_total(block.get("Single Bit")), _bit_total(block.get("Double Bit"))
    return (_leaf_counts(block, "correctable", skip="uncorrectable"),
            _leaf_counts(block, "uncorrectable"))


def _section(tree: Tree, name: str) -> Tree:
    for key, value in tree.items():
        if key.lower() == name.lower() and isinstance(value, dict):
            return value
    return {}


def _any_flag(block: Tree, *keys: str) -> Optional[bool]:
    """True if any of ``keys`` says yes, False if one says no and none yes, None if absent."""
    values = [block.get(key) for key in keys]
    known = [flag for flag in (to_bool(v) for v in values if isinstance(v, str)) if flag is not None]
    return any(known) if known else None


def ecc_from_query(gpu: GpuQuery) -> GpuEcc:
    """Reduce a ``-q -d ECC`` section to a :class:`GpuEcc`."""
    errors = _section(gpu.tree, "ECC Errors")
    volatile = _correctable_uncorrectable(_section(errors, "Volatile"))
    aggregate_block = _section(errors, "Aggregate")
    aggregate = _correctable_uncorrectable(aggregate_block)
    retired = _section(gpu.tree, "Retired Pages")
    remapped = _section(gpu.tree, "Remapped Rows")
    pending_key = next((k for k in retired if "pending" in k.lower()), None)
    return GpuEcc(
        bus_id=gpu.bus_id,
        ecc_enabled=to_bool(_section(gpu.tree, "ECC Mode").get("Current")),
        volatile_correctable=volatile[0],
        volatile_uncorrectable=volatile[1],
        aggregate_correctable=aggregate[0],
        aggregate_uncorrectable=aggregate[1],
        sram_threshold_exceeded=to_bool(aggregate_block.get("SRAM Threshold Exceeded")),
        retired_pending=to_bool(retired.get(pending_key)) if pending_key else None,
        remap_pending=to_bool(remapped.get("Pending")),
        remap_failure=to_bool(remapped.get("Remapping Failure Occurred")),
        remapped_uncorrectable=to_int(remapped.get("Uncorrectable Error")),
        repair_pending=_any_flag(errors, "Channel Repair Pending", "TPC Repair Pending"),
        unrepairable_memory=_any_flag(errors, "Unrepairable Memory"),
    )


# What the driver's ``GPU Recovery Action`` asks for (NVML_GPU_RECOVERY_ACTION_*);
# "None" means the GPU can be used again at once.
_RECOVERY_ADVICE = {
    "reset": "stop its processes and reset the GPU (nvidia-smi -r)",
    "reboot": "reboot the node: the fault may have left the OS inconsistent",
    "drain p2p": "stop the processes that use peer-to-peer traffic, then query the action again",
    "drain and reset": "drain its work, then reset the GPU (nvidia-smi -r)",
}


def recovery_findings(gpu: GpuQuery) -> list[Finding]:
    """A failing finding when the driver asks for a recovery action after a fault."""
    action = gpu.tree.get("GPU Recovery Action")
    if not isinstance(action, str) or action.strip().lower() in ("none", *NOT_AVAILABLE):
        return []
    advice = _RECOVERY_ADVICE.get(action.strip().lower(), "see the NVIDIA GPU recovery documentation")
    return [fail("gpu.recovery_action",
                 f"GPU {gpu.bus_id}: the driver asks for recovery action {action!r} after a fault: "
                 f"drain the node and {advice}", bus_id=gpu.bus_id, action=action)]


def parse_query_csv(text: str, fields: Optional[list[str]] = None) -> list[dict]:
    """Parse ``--query-gpu=... --format=csv[,noheader][,nounits]``.

    Without ``fields`` the first line is the header (units in brackets are
    dropped from names). ``N/A``, ``[N/A]`` and ``[Not Supported]`` become None;
    numbers (with or without a unit) become floats; words stay strings.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if fields is None:
        if not lines:
            return []
        fields = [_UNIT_SUFFIX.sub("", name.strip()) for name in lines[0].split(",")]
        lines = lines[1:]
    rows = []
    for line in lines:
        values = [value.strip() for value in line.split(",")]
        rows.append({name: _csv_value(value) for name, value in zip(fields, values)})
    return rows


def _csv_value(value: str) -> Union[float, str, None]:
    if value.strip("[] ").lower() in ("n/a", "not supported", ""):
        return None
    number = to_float(value)
    return number if number is not None else value


def _csv_count(row: dict, prefix: str) -> Optional[int]:
    """A count field, or the sum of the per-unit fields under ``prefix``."""
    if isinstance(row.get(prefix + "total"), float):
        return int(row[prefix + "total"])
    return _sum([int(v) for k, v in row.items() if k.startswith(prefix) and isinstance(v, float)])


def _csv_flag(row: dict, *names: str) -> Optional[bool]:
    for name in names:
        value = row.get(name)
        if isinstance(value, float):
            return value > 0
        if isinstance(value, str):
            return to_bool(value)
    return None


def ecc_from_csv_row(row: dict) -> GpuEcc:
    """Reduce one ``--query-gpu`` / ``--query-remapped-rows`` row to a :class:`GpuEcc`."""
    bus = row.get("pci.bus_id") or row.get("gpu_bus_id") or row.get("index") or "?"
    return GpuEcc(
        bus_id=str(bus),
        ecc_enabled=_csv_flag(row, "ecc.mode.current"),
        volatile_correctable=_csv_count(row, "ecc.errors.corrected.volatile."),
        volatile_uncorrectable=_csv_count(row, "ecc.errors.uncorrected.volatile."),
        aggregate_correctable=_csv_count(row, "ecc.errors.corrected.aggregate."),
        aggregate_uncorrectable=_csv_count(row, "ecc.errors.uncorrected.aggregate."),
        retired_pending=_csv_flag(row, "retired_pages.pending"),
        remap_pending=_csv_flag(row, "remapped_rows.pending"),
        remap_failure=_csv_flag(row, "remapped_rows.failure"),
        remapped_uncorrectable=_csv_count(row, "remapped_rows.uncorrectable"),
    )


def ecc_findings(ecc: GpuEcc, correctable_warn: int = 10000, uncorrectable_fail: int = 0,
                 aggregate_uncorrectable_fail: int = 4) -> list[Finding]:
    """Judge one GPU's ECC state; returns only what is not healthy."""
    gpu = f"GPU {ecc.bus_id}"
    out: list[Finding] = []
    if ecc.ecc_enabled is False:
        out.append(warn("gpu.ecc.disabled", f"{gpu}: ECC is disabled; memory errors would go "
                        "unnoticed (nvidia-smi -e 1, then reboot)", bus_id=ecc.bus_id))
    failing_now = (ecc.volatile_uncorrectable or 0) > uncorrectable_fail
    if failing_now:
        out.append(fail("gpu.ecc.uncorrectable",
                        f"{gpu}: {ecc.volatile_uncorrectable} uncorrectable (double-bit) ECC "
                        "errors since the driver loaded: drain the node and reset the GPU",
                        bus_id=ecc.bus_id, count=ecc.volatile_uncorrectable))
    lifetime = ecc.aggregate_uncorrectable or 0
    if lifetime > aggregate_uncorrectable_fail or ecc.sram_threshold_exceeded:
        sram = " and the SRAM threshold is exceeded" if ecc.sram_threshold_exceeded else ""
        out.append(fail("gpu.ecc.rma",
                        f"{gpu}: {lifetime} uncorrectable ECC errors in its lifetime{sram}: "
                        "replace the GPU (RMA)", bus_id=ecc.bus_id, count=lifetime))
    elif lifetime > 0 and not failing_now:  # the volatile finding already says it
        out.append(warn("gpu.ecc.aggregate_uncorrectable",
                        f"{gpu}: {lifetime} uncorrectable ECC errors in its lifetime; watch it",
                        bus_id=ecc.bus_id, count=lifetime))
    if (ecc.volatile_correctable or 0) > correctable_warn:
        out.append(warn("gpu.ecc.correctable_high",
                        f"{gpu}: {ecc.volatile_correctable} correctable ECC errors since the "
                        f"driver loaded, above {correctable_warn}: memory is degrading",
                        bus_id=ecc.bus_id, count=ecc.volatile_correctable))
    if ecc.unrepairable_memory:
        out.append(fail("gpu.ecc.unrepairable",
                        f"{gpu}: the GPU reports memory it cannot repair: drain the node and "
                        "replace the GPU (RMA)", bus_id=ecc.bus_id))
    if ecc.remap_failure:
        out.append(fail("gpu.row_remap.failed",
                        f"{gpu}: row remapping failed, bad memory rows cannot be retired: "
                        "drain the node; RMA the GPU if it repeats after a reset",
                        bus_id=ecc.bus_id))
    pending = [what for flag, what in ((ecc.remap_pending, "row remap"),
                                       (ecc.retired_pending, "page retirement"),
                                       (ecc.repair_pending, "channel/TPC repair")) if flag]
    if pending:
        out.append(warn("gpu.ecc.reset_pending",
                        f"{gpu}: a {' and a '.join(pending)} is pending; reset the GPU (or reload "
                        "the driver) to activate it", bus_id=ecc.bus_id))
    return out


# Texts nvidia-smi prints when it cannot do its job, most specific first.
_ERROR_TEXTS = (
    ("Unable to determine the device handle", "gpu.lost",
     "a GPU does not answer the driver (fallen off the bus?): drain the node and reboot it"),
    ("couldn't communicate with the NVIDIA driver", "gpu.driver",
     "nvidia-smi cannot talk to the NVIDIA driver: the driver is not loaded or is broken"),
    ("No devices were found", "gpu.none", "nvidia-smi is installed but sees no GPU"),
)


def error_findings(output: str, returncode: int) -> list[Finding]:
    """Findings for nvidia-smi's own complaints (lost GPU, no driver, bad infoROM)."""
    out: list[Finding] = []
    for needle, code, meaning in _ERROR_TEXTS:
        line = next((ln.strip() for ln in output.splitlines() if needle in ln), None)
        if line:
            out.append(fail(code, meaning, line=line))
    for line in output.splitlines():
        if "infoROM is corrupted" in line:
            out.append(warn("gpu.inforom", f"{line.strip()} (update or reflash the infoROM)",
                            line=line.strip()))
    if returncode != 0 and not any(f.severity.value == "fail" for f in out):
        first = next((ln.strip() for ln in output.splitlines() if ln.strip()), "no output")
        out.append(fail("gpu.smi_failed", f"nvidia-smi exited with {returncode}: {first}",
                        returncode=returncode))
    return out
