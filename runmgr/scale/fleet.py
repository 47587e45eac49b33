"""A health check over thousands of simulated nodes: the real fleet check (runmgr/healthcheck/
fleet_run.py) with each node's probes answered by the real parsers and judges from simulated
tool output, and the collective tests measured by a simulated network.

What is real: ``nvidia-smi -q`` text in the tool's format read by the real parser and ECC
judge (health/probes/devices.py's ``probe_nvidia`` with a runner that returns it), a
``/proc/mounts`` table read by the real mount check, the fleet's peer comparison
(health/fleet.py), the collective tests' pairing, re-pairing and blame (health/groups.py via
runmgr/healthcheck/collectives.py), the verdicts. What is simulated: the nodes (no process,
no Ray node each), the figures a benchmark would measure (a node's TFLOP/s, its copy and
storage speeds, a group's all-reduce bandwidth: the fleet's value with 1% of noise, a
planted node's lowered), and the storage write probe's own figures.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from health.config import HealthConfig, MountSpec
from health.findings import ProbeResult
from health.fleet import HOST_FACT
from health.groups import Group
from health.node import NodeReport
from health.parsers.mounts import mount_findings, parse_mounts
from health.probes.bounded import CommandResult
from health.probes.devices import probe_nvidia
from runmgr.healthcheck.fleet_run import FleetCheck, Progress, run_fleet_check
from runmgr.healthcheck.nodes import RayNode

HPFS = MountSpec(path="/mnt/hpfs/checkpoints", fstype="lustre")
"""The shared file system every simulated node must have (the checkpoints' HPFS)."""
GPUS_PER_NODE = 8
SLOW_FACTOR = 0.7
"""A planted slow node's figure: 30% below the fleet's (its compute, or its network)."""
NOISE = 0.01


@dataclass(frozen=True)
class PlantedFleet:
    """``nodes`` simulated nodes, some of them bad: a share slow (half in compute, half in their
    network), a share with an uncorrectable ECC error on one GPU, a share whose HPFS mount failed."""

    nodes: int
    slow_share: float = 0.01
    ecc_share: float = 0.005
    mount_share: float = 0.005
    seed: int = 0

    @property
    def names(self) -> list[str]:
        return [f"sim{i:05d}" for i in range(self.nodes)]

    def planted(self) -> dict[str, set[str]]:
        """The bad nodes of each kind (``slow_compute``, ``slow_network``, ``ecc``, ``mount``),
        disjoint, drawn by ``seed``."""
        draw = random.Random(self.seed).sample(self.names, self.nodes)
        counts = {"slow": round(self.nodes * self.slow_share), "ecc": round(self.nodes * self.ecc_share),
                  "mount": round(self.nodes * self.mount_share)}
        slow, draw = draw[:counts["slow"]], draw[counts["slow"]:]
        ecc, draw = draw[:counts["ecc"]], draw[counts["ecc"]:]
        return {"slow_compute": set(slow[::2]), "slow_network": set(slow[1::2]), "ecc": set(ecc),
                "mount": set(draw[:counts["mount"]])}

    def bad(self) -> set[str]:
        return set().union(*self.planted().values())


def nvidia_query(gpus: int, uncorrectable_on: int | None) -> str:
    """``nvidia-smi -q`` of a node of ``gpus`` H100s, in the tool's layout (the parts the parser
    reads), with one uncorrectable DRAM error on GPU ``uncorrectable_on`` (None: clean)."""
    lines = ["", "==============NVSMI LOG==============", "",
             "Timestamp                                              : Sun Nov 29 01:30:00 2026",
             "Driver Version                                         : 550.54.15",
             "CUDA Version                                           : 12.4", "",
             f"Attached GPUs                                          : {gpus}"]
    for index in range(gpus):
        bad = 1 if index == uncorrectable_on else 0
        lines += [
            f"GPU 00000000:{0x18 + index:02X}:00.0",
            "    Product Name                                       : NVIDIA H100 80GB HBM3",
            "    ECC Mode",
            "        Current                                        : Enabled",
            "        Pending                                        : Enabled",
            "    ECC Errors",
            "        Volatile",
            "            SRAM Correctable                           : 0",
            "            SRAM Uncorrectable Parity                  : 0",
            "            SRAM Uncorrectable SEC-DED                 : 0",
            "            DRAM Correctable                           : 0",
            f"            DRAM Uncorrectable                         : {bad}",
            "        Aggregate",
            "            SRAM Correctable                           : 0",
            "            SRAM Uncorrectable Parity                  : 0",
            "            SRAM Uncorrectable SEC-DED                 : 0",
            "            DRAM Correctable                           : 0",
            f"            DRAM Uncorrectable                         : {bad}",
            "            SRAM Threshold Exceeded                    : No",
            "    Remapped Rows",
            "        Correctable Error                              : 0",
            "        Uncorrectable Error                            : 0",
            "        Pending                                        : No",
            "        Remapping Failure Occurred                     : No", ""]
    return "\n".join(lines)


def mounts_table(hpfs_mounted: bool) -> str:
    """``/proc/mounts`` of a node, with or without its HPFS mount."""
    table = "overlay / overlay rw,relatime 0 0\nproc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
    return table + ("10.0.2.15@o2ib:/hpfs /mnt/hpfs lustre rw,flock,lazystatfs 0 0\n" if hpfs_mounted else "")


@dataclass
class SimulatedProbes:
    """Answers each node's probes as its tools and benchmarks would, for a :class:`PlantedFleet`."""

    fleet: PlantedFleet
    config: HealthConfig
    planted: dict[str, set[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.planted = self.fleet.planted()
        self._noise = random.Random(self.fleet.seed + 1)

    def gather(self, nodes: Sequence[RayNode], config: HealthConfig, progress: Progress) -> list[NodeReport]:
        """Every node's report (``run_fleet_check``'s ``gather`` seam)."""
        reports = [self.node_report(node.node_id) for node in nodes]
        progress(f"  [{len(reports)}/{len(nodes)}] simulated nodes probed")
        return reports

    def node_report(self, node: str) -> NodeReport:
        started = time.time()
        query = nvidia_query(GPUS_PER_NODE, 3 if node in self.planted["ecc"] else None)

        def run(name: str, args: Sequence[str]) -> CommandResult:
            if name == "nvidia-smi":
                return CommandResult((name, *args), "ok", 0, query, "", 0.01)
            return CommandResult((name, *args), "ok", 0, "", "", 0.01)  # dmesg: no Xid

        devices = probe_nvidia(run, self.config.devices)
        storage = ProbeResult(mount_findings(parse_mounts(mounts_table(node not in self.planted["mount"])),
                                             HPFS.path, HPFS.fstype))
        if not storage.findings or storage.findings[0].code == "storage.mounted":
            storage.figures = {f"storage.write_mbps@{HPFS.path}": self._figure(2000.0),
                               f"storage.read_mbps@{HPFS.path}": self._figure(4000.0),
                               f"storage.latency_ms@{HPFS.path}": self._figure(2.0)}
        slow = SLOW_FACTOR if node in self.planted["slow_compute"] else 1.0
        compute = ProbeResult(figures={"compute.matmul_tflops": self._figure(700.0) * slow,
                                       "compute.memory_gbps": self._figure(2800.0)})
        report = NodeReport.from_probes(node, [devices, storage, compute], started, time.time() - started)
        report.facts.update({"node.hostname": node, HOST_FACT: f"env:{node}"})
        return report

    def measure(self, groups: list[Group]) -> tuple[dict[Group, float], dict[Group, str]]:
        """All-reduce bus bandwidth of disjoint groups at once: the slowest member's network."""
        return {group: min(self._figure(180.0) * (SLOW_FACTOR if node in self.planted["slow_network"] else 1.0)
                           for node in group) for group in groups}, {}

    def _figure(self, value: float) -> float:
        return value * (1 + self._noise.uniform(-NOISE, NOISE))


def simulated_config() -> HealthConfig:
    """The default health config with the simulated fleet's HPFS mount and GPU count."""
    config = HealthConfig()
    config.storage.mounts = [HPFS]
    config.devices.expected_devices = GPUS_PER_NODE
    return config


def check_simulated_fleet(fleet: PlantedFleet, progress: Progress,
                          clock: Callable[[], float] = time.time) -> tuple[FleetCheck, SimulatedProbes]:
    """The real fleet check over ``fleet``'s simulated nodes, and the probes that answered it."""
    config = simulated_config()
    probes = SimulatedProbes(fleet, config)
    nodes = [RayNode(name, "127.0.0.1", name) for name in fleet.names]
    check = run_fleet_check(config, "cuda", progress, clock, nodes=nodes, measure=probes.measure,
                            gather=probes.gather)
    return check, probes
