"""Accelerator inventory and health, by asking the vendor tools found on PATH.

Ascend: ``npu-smi info``, then per NPU ``-t health`` and ``-t ecc``, and per
chip ``hccn_tool -link`` / ``-net_health``. NVIDIA: ``nvidia-smi -q`` and the
kernel log's Xid lines. A missing tool means "not present" (a CPU-only node
says so); a tool that hangs fails by its timeout with the command named.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

from health.config import DeviceChecks
from health.findings import Finding, ProbeResult, fail, ok, warn
from health.parsers import hccn_tool, npu_smi, nvidia_smi, xid
from health.probes.bounded import CommandResult, run_tool

Runner = Callable[[str, Sequence[str]], CommandResult]
_PARALLEL_QUERIES = 8


def _tool_runner(checks: DeviceChecks, path: Optional[str]) -> Runner:
    def run(name: str, args: Sequence[str]) -> CommandResult:
        return run_tool(name, args, checks.tool_timeout_s, path=path)
    return run


def command_failure(result: CommandResult, code: str, fatal: bool = True) -> Finding:
    """A finding for a tool call that timed out or exited non-zero."""
    if result.status == "timeout":
        return fail(f"{code}.timeout",
                    f"`{result.command}` did not answer within {result.seconds:.0f} s: the "
                    "driver or device is hung; drain the node", command=result.command)
    first = next((ln.strip() for ln in result.output.splitlines() if ln.strip()), "no output")
    make = fail if fatal else warn
    return make(f"{code}.error", f"`{result.command}` exited with {result.returncode}: {first}",
                command=result.command, returncode=result.returncode)


def _count_findings(found: int, expected: Optional[int], kind: str) -> list[Finding]:
    if expected is None or found >= expected:
        return []
    return [fail("devices.missing",
                 f"found {found} {kind}, expected {expected}: a device is lost or not "
                 "visible to the driver; drain the node", found=found, expected=expected)]


def _npu_queries(run: Runner, npu_id: int, checks: DeviceChecks) -> list[Finding]:
    findings: list[Finding] = []
    health = run("npu-smi", ["info", "-t", "health", "-i", str(npu_id)])
    if health.status == "ok":
        findings += npu_smi.health_findings(npu_smi.parse_health(health.stdout), npu_id)
    else:
        findings.append(command_failure(health, "npu.health", fatal=False))
    ecc = run("npu-smi", ["info", "-t", "ecc", "-i", str(npu_id)])
    if ecc.status == "ok":
        findings += npu_smi.ecc_findings(npu_smi.parse_ecc(ecc.stdout), npu_id,
                                         checks.ecc_correctable_warn,
                                         checks.ecc_uncorrectable_fail)
    else:
        findings.append(command_failure(ecc, "npu.ecc", fatal=False))
    return findings


def _roce_queries(run: Runner, device: int) -> list[Finding]:
    link = run("hccn_tool", ["-i", str(device), "-link", "-g"])
    if link.status == "absent":
        return []
    findings = (hccn_tool.link_findings(device, hccn_tool.parse_link(link.stdout))
                if link.status == "ok" else [command_failure(link, "roce.link")])
    health = run("hccn_tool", ["-i", str(device), "-net_health", "-g"])
    findings += (hccn_tool.net_health_findings(device, hccn_tool.parse_net_health(health.stdout))
                 if health.status == "ok" else [command_failure(health, "roce.net_health")])
    return findings


def probe_ascend(run: Runner, checks: DeviceChecks) -> Optional[ProbeResult]:
    """None when npu-smi is not installed; else the NPUs' findings and inventory."""
    info = run("npu-smi", ["info"])
    if info.status == "absent":
        return None
    if info.status != "ok":
        return ProbeResult([command_failure(info, "npu.info")], facts={"accelerator": "npu"})
    inventory = npu_smi.parse_info(info.stdout)
    result = ProbeResult(facts={
        "accelerator": "npu", "device_count": len(inventory.npu_ids),
        "chip_count": len(inventory.chips), "device_name": _names(c.name for c in inventory.chips),
        "npu_smi": inventory.version})
    if not inventory.chips:
        result.findings.append(fail("npu.none", "npu-smi info lists no NPU: the driver sees "
                                    "no device", first_line=info.stdout.strip()[:120]))
        return result
    result.findings += npu_smi.info_findings(inventory)
    result.findings += _count_findings(len(inventory.npu_ids), checks.expected_devices, "NPUs")
    with ThreadPoolExecutor(_PARALLEL_QUERIES) as pool:
        per_npu = pool.map(lambda n: _npu_queries(run, n, checks), inventory.npu_ids)
        per_chip = (pool.map(lambda d: _roce_queries(run, d), range(len(inventory.chips)))
                    if checks.check_roce else [])
        for findings in [*per_npu, *per_chip]:
            result.findings += findings
    return result


def probe_nvidia(run: Runner, checks: DeviceChecks) -> Optional[ProbeResult]:
    """None when nvidia-smi is not installed; else the GPUs' findings and inventory."""
    query = run("nvidia-smi", ["-q"])
    if query.status == "absent":
        return None
    if query.status == "timeout":
        return ProbeResult([command_failure(query, "gpu.query")], facts={"accelerator": "cuda"})
    header, gpus = nvidia_smi.parse_query(query.stdout)
    result = ProbeResult(facts={
        "accelerator": "cuda", "device_count": len(gpus),
        "device_name": _names(str(g.tree.get("Product Name", "?")) for g in gpus),
        "nvidia_driver": header.get("Driver Version")})
    result.findings += nvidia_smi.error_findings(query.output, query.returncode or 0)
    for gpu in gpus:
        result.findings += nvidia_smi.ecc_findings(
            nvidia_smi.ecc_from_query(gpu), checks.ecc_correctable_warn,
            checks.ecc_uncorrectable_fail, checks.aggregate_uncorrectable_fail)
        result.findings += nvidia_smi.recovery_findings(gpu)
    result.findings += _count_findings(len(gpus), checks.expected_devices, "GPUs")
    if checks.read_kernel_log:
        result.findings += _kernel_log_findings(run)
    if gpus and not any(f.severity.rank for f in result.findings):
        result.findings.insert(0, ok("gpu.ok", f"{len(gpus)} GPUs, ECC and Xid clean",
                                     gpus=len(gpus)))
    return result


def _kernel_log_findings(run: Runner) -> list[Finding]:
    log = run("dmesg", [])
    if log.status == "absent":
        return [warn("gpu.xid.unreadable", "dmesg is not on PATH: Xid events cannot be read")]
    if log.status != "ok":
        return [warn("gpu.xid.unreadable",
                     f"cannot read the kernel log for Xid events ({log.output.strip()[:100]}); "
                     "run the check as root or allow dmesg")]
    return xid.xid_findings(xid.parse_xid(log.stdout))


def _names(names) -> str:
    return ",".join(sorted(set(names)))


def _cpu_only_facts() -> dict:
    return {"accelerator": "cpu", "device_count": 0, "cpu_count": os.cpu_count() or 0}


def probe_devices(checks: DeviceChecks, path: Optional[str] = None) -> ProbeResult:
    """Inventory and health of every accelerator the vendor tools on ``path``
    (default $PATH) can see; a CPU-only node reports its CPUs."""
    run = _tool_runner(checks, path)
    result = ProbeResult()
    for part in (probe_ascend(run, checks), probe_nvidia(run, checks)):
        if part is not None:
            result.extend(part)
    if "accelerator" not in result.facts:
        result.facts.update(_cpu_only_facts())
        result.findings.append(ok("devices.cpu_only",
                                  "no npu-smi or nvidia-smi on PATH: a CPU-only node with "
                                  f"{result.facts['cpu_count']} CPUs",
                                  cpu_count=result.facts["cpu_count"]))
        result.findings += _count_findings(0, checks.expected_devices, "accelerators")
    return result
