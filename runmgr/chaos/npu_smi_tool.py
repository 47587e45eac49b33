"""A scripted ``npu-smi`` for chaos runs: healthy until chaos breaks a node.

Installed (with a ``#!`` line naming this Python) as ``npu-smi`` in the
chaos tools directory, which runmgr puts first on the PATH of its device
poll. It answers ``info``, ``info -t health -i N`` and ``info -t ecc -i N``
in the formats of the real tool (../shared/FORMATS.md 1.1-1.3: the 910B
table, the health record, the 950 ECC record). It reads ``ecc_state.json``
beside itself: a fault listed there for the node it runs on shows as
uncorrectable (double-bit) HBM ECC errors, the way OPT's nodes showed them
before being drained.

Which node it runs on: ``$RUNMGR_NODE_ID`` (a Ray node id) when the caller
sets it, else ``$RAY_RAYLET_PID``, which every process started from a Ray
worker inherits and which differs between the Ray nodes of one host.
Standard library only: it must start fast on any node.
"""

from __future__ import annotations

import json
import os
import sys

STATE_NAME = "ecc_state.json"
NPU_COUNT = 1
BUS_IDS = ("0000:C1:00.0", "0000:C2:00.0", "0000:81:00.0", "0000:82:00.0")


def active_faults(state_path: str, environ: dict) -> dict[int, dict]:
    """NPU id -> fault, for the faults of the node this process runs on."""
    try:
        with open(state_path) as handle:
            faults = json.load(handle).get("faults", [])
    except FileNotFoundError:
        return {}
    node_id = environ.get("RUNMGR_NODE_ID")
    raylet = environ.get("RAY_RAYLET_PID")
    mine = {}
    for fault in faults:
        if (node_id and fault.get("node_id") == node_id) or (
                not node_id and raylet and str(fault.get("raylet_pid")) == raylet):
            mine[int(fault.get("npu", 0))] = fault
    return mine


def info_table(faults: dict[int, dict]) -> str:
    rule = "+---------------------------+---------------+----------------------------------------------------+"
    rows = [
        rule,
        "| npu-smi 24.1.0                   Version: 24.1.0                                               |",
        rule,
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
        "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
        "+===========================+===============+====================================================+",
    ]
    for npu in range(NPU_COUNT):
        health = faults[npu].get("health", "OK") if npu in faults else "OK"
        rows.append(f"| {npu:<5} 910B3               | {health:<13} | "
                    "98.6        39                0    / 0             |")
        rows.append(f"| 0                         | {BUS_IDS[npu]:<13} | "
                    "0           0    / 0          3387 / 65536         |")
        rows.append("+===========================+===============+====================================================+")
    return "\n".join(rows)


def health_record(npu: int, faults: dict[int, dict]) -> str:
    fault = faults.get(npu)
    health = fault.get("health", "OK") if fault else "OK"
    code = fault.get("error_code", "NA") if fault and health != "OK" else "NA"
    info = fault.get("error_info", "NA") if fault and health != "OK" else "NA"
    return "\n".join([
        f"\t{'NPU ID':<30} : {npu}",
        f"\t{'Health':<30} : {health}",
        f"\t{'Error Code':<30} : {code}",
        f"\t{'Error Information':<30} : {info}",
    ])


def ecc_record(npu: int, faults: dict[int, dict]) -> str:
    fault = faults.get(npu, {})
    double = int(fault.get("double_bit", 0))
    single = int(fault.get("single_bit", 0))
    lines = [
        ("NPU ID", npu),
        ("HBM Single Bit Error Count", single),
        ("HBM Double Bit Error Count", double),
        ("HBM Single Bit Aggregate Total Err Cnt", single),
        ("HBM Double Bit Aggregate Total Err Cnt", double),
        ("HBM Single Bit Isolated Pages Count", 0),
        ("HBM Double Bit Isolated Pages Count", double),
        ("HBM Single Bit Next-Isolated Pages Count", 0),
        ("HBM Double Bit Next-Isolated Pages Count", 0),
    ]
    return "\n".join(f"\t{key:<40} : {value}" for key, value in lines)


def answer(argv: list[str], faults: dict[int, dict]) -> tuple[int, str]:
    """(exit code, output) of ``npu-smi ARGV``."""
    if argv == ["info"]:
        return 0, info_table(faults)
    if len(argv) == 5 and argv[:2] == ["info", "-t"] and argv[3] == "-i" and argv[4].isdigit():
        npu = int(argv[4])
        if npu >= NPU_COUNT:
            return 255, f"The device id {npu} is invalid."
        if argv[2] == "health":
            return 0, health_record(npu, faults)
        if argv[2] == "ecc":
            return 0, ecc_record(npu, faults)
    return 255, f"Error: this npu-smi (runmgr chaos) does not answer {' '.join(argv) or 'nothing'}"


def main() -> int:
    state = os.path.join(os.path.dirname(os.path.abspath(__file__)), STATE_NAME)
    code, text = answer(sys.argv[1:], active_faults(state, dict(os.environ)))
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
