"""Thresholds and targets of the health check, mirrored by ``conf/health/default.yaml``.

Every field has a docstring; :func:`health_config_from_dict` builds the
dataclasses from the composed YAML and rejects unknown keys and wrong types
with one line that names the key and the fix.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Optional


class HealthConfigError(ValueError):
    """The health configuration is wrong; the message names the key and the fix."""


class Choice(str, Enum):
    """A closed set of values for a field: a ``str`` enum so YAML keeps plain
    strings and OmegaConf (which refuses ``Literal``) names the choices when a
    value is wrong. Member names are their values (OmegaConf converts by name).
    trainer/config.py has the same base; health imports nothing from the trainer."""

    def __str__(self) -> str:
        return self.value


class ComputeDtype(Choice):
    """Element types the compute benchmark multiplies in."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class MismatchAction(Choice):
    """What a node whose software stack differs from the fleet's majority gets."""

    exclude = "exclude"
    warn = "warn"


@dataclass
class DeviceChecks:
    """Accelerator inventory, health and ECC (npu-smi, hccn_tool, nvidia-smi, Xid)."""

    tool_timeout_s: float = 15.0
    """Seconds one vendor-tool call may take; a hung driver then fails with a reason."""
    expected_devices: Optional[int] = None
    """Accelerators each node must show (NPUs or GPUs); None accepts any count."""
    ecc_correctable_warn: int = 10000
    """Correctable (single-bit) errors since boot above which a node is warned (OPT: 10000)."""
    ecc_uncorrectable_fail: int = 0
    """Uncorrectable errors since boot above which a node is excluded (OPT: any)."""
    aggregate_uncorrectable_fail: int = 4
    """Lifetime uncorrectable errors above which the device needs replacing (RMA)."""
    check_roce: bool = True
    """Ascend: check each chip's RoCE link and network health with hccn_tool."""
    read_kernel_log: bool = True
    """Read ``dmesg`` for NVIDIA Xid events."""


@dataclass
class MountSpec:
    """One shared file system every node must have (HPFS, Lustre, GPFS, NFS, FUSE)."""

    path: str = ""
    """Directory on the mount where the probe writes its test file."""
    fstype: Optional[str] = None
    """Expected type: lustre, gpfs, nfs (nfs/nfs4), fuse (any fuse.*) or an exact
    kernel type; None for a plain directory (no type check)."""
    min_free_gb: float = 100.0
    """Free space needed for checkpoints, in GB (10^9 bytes)."""
    min_write_mbps: float = 100.0
    """Lowest acceptable write throughput of the probe file (fsync included), MB/s."""
    min_read_mbps: float = 100.0
    """Lowest acceptable read throughput of the probe file, MB/s."""
    max_latency_ms: float = 200.0
    """Highest acceptable median latency of create+write+fsync+unlink of a small file."""


@dataclass
class StorageChecks:
    """Shared mounts: present, of the right type, responsive, writable, fast, with room."""

    mounts: list[MountSpec] = field(default_factory=list)
    """The shared mounts to check on every node."""
    timeout_s: float = 30.0
    """Seconds one mount's probe may take; a hung mount fails with the step it hung in."""
    probe_mb: float = 16.0
    """Size of the throughput test file, MB."""
    latency_ops: int = 5
    """Small-file round trips timed for the latency figure."""


@dataclass
class ComputeChecks:
    """Matrix-multiply speed and memory bandwidth of one device."""

    device: str = "auto"
    """torch device the benchmark runs on: ``auto`` (the node's accelerator if torch
    sees one, else the CPU), or one torch spells (``cpu``, ``cuda:0``, ``npu:0``)."""
    dtype: ComputeDtype = ComputeDtype.float32
    """Matmul dtype: the dtype the run trains in (float32, bfloat16, float16)."""
    matmul_size: int = 1024
    """Side of the square matrices multiplied."""
    repeats: int = 20
    """Timed repetitions (after one warm-up); the best is reported."""
    bandwidth_mb: float = 64.0
    """Size of the buffer copied for the memory-bandwidth figure, MB."""
    cpu_threads: int = 1
    """Threads a benchmark on the CPU uses. One by default: on a shared or busy host a
    multi-threaded matmul measures its neighbours (threads spin while one of them waits
    for a core) and every node looks equally slow; one thread measures the node."""


@dataclass
class DataChecks:
    """The run's dataset on local disk: present, right size, right checksum."""

    local_path: Optional[str] = None
    """Where the dataset must be on each node; None skips the data check."""
    shared_path: Optional[str] = None
    """Where ``--stage`` copies it from (a shared mount)."""
    size_bytes: Optional[int] = None
    """Expected size; None takes the shared copy's size."""
    sha256: Optional[str] = None
    """Expected SHA-256 hex digest; None skips the checksum."""
    chunk_mb: float = 8.0
    """Copy and hash chunk, MB."""


@dataclass
class CollectiveChecks:
    """All-reduce bandwidth in small groups of nodes, with the run's backend."""

    enabled: bool = True
    """Run the group tests (they need two nodes or more that passed the node probes)."""
    group_size: int = 2
    """Nodes per group in the first round (pairs); suspects are re-paired in a second."""
    megabytes: float = 4.0
    """Size of the all-reduced tensor, MB."""
    iterations: int = 3
    """Timed all-reduces per group (after one warm-up); the best is kept."""
    timeout_s: float = 60.0
    """Seconds a group may take to form and measure; a group that does not finish fails."""


@dataclass
class FleetChecks:
    """How nodes are compared with their peers."""

    min_nodes: int = 3
    """Fewest nodes with a figure before outliers are judged (fewer: no comparison)."""
    mad_k: float = 4.0
    """A node is an outlier beyond this many robust standard deviations (1.4826 x MAD)."""
    exclude_relative: float = 0.15
    """...and at least this fraction worse than the median to be excluded (noise floor)."""
    warn_relative: float = 0.07
    """...or at least this fraction worse (and beyond mad_k) to be warned."""
    higher_is_better: list[str] = field(default_factory=lambda: [
        "compute.matmul_tflops", "compute.memory_gbps",
        "storage.write_mbps", "storage.read_mbps", "collectives.busbw_gbps",
    ])
    """Figures (name before any ``@subject``) where a low value is the bad one."""
    lower_is_better: list[str] = field(default_factory=lambda: ["storage.latency_ms"])
    """Figures where a high value is the bad one."""
    software_keys: list[str] = field(default_factory=lambda: [
        "python", "torch", "torch_npu", "cann", "driver", "ray", "runmgr",
        "deepspeed", "megatron_core",
    ])
    """Versions that must agree across the fleet (seed 000: mismatched stacks)."""
    software_mismatch: MismatchAction = MismatchAction.exclude
    """What a node off the majority stack gets: ``exclude`` or ``warn``."""


@dataclass
class HealthConfig:
    """The whole health check (``conf/health/*.yaml``)."""

    devices: DeviceChecks = field(default_factory=DeviceChecks)
    """Accelerators."""
    storage: StorageChecks = field(default_factory=StorageChecks)
    """Shared file systems."""
    compute: ComputeChecks = field(default_factory=ComputeChecks)
    """Compute benchmark."""
    data: DataChecks = field(default_factory=DataChecks)
    """Local dataset."""
    fleet: FleetChecks = field(default_factory=FleetChecks)
    """Peer comparison."""
    collectives: CollectiveChecks = field(default_factory=CollectiveChecks)
    """Small-group all-reduce tests across nodes."""
    skip: bool = False
    """``runmgr launch``: skip the probes; the exclusions of the last check still apply."""
    node_timeout_s: float = 120.0
    """Seconds the probes of one node may take together; a node that does not answer is excluded."""
    poll_interval_s: float = 5.0
    """During a run: seconds between two device polls (health, ECC) on every node."""


def health_config_from_dict(data: Optional[Mapping[str, Any]]) -> HealthConfig:
    """Build and validate a :class:`HealthConfig` from plain data (the composed YAML)."""
    config = _build(HealthConfig, data or {}, "health")
    validate(config)
    return config


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise HealthConfigError(f"{where}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise HealthConfigError(
            f"{where}.{unknown[0]}: unknown key; known keys are {', '.join(names)}")
    values = {name: _convert(hints[name], data[name], f"{where}.{name}")
              for name in names if name in data}
    return cls(**values)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        return _convert(next(a for a in args if a is not type(None)), value, where)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _choice(hint, value, where)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise HealthConfigError(f"{where}: expected a list, got {value!r}")
        return [_convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise HealthConfigError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    return _scalar(hint, value, where)


def _choice(hint: type[Enum], value: Any, where: str) -> Enum:
    try:
        return hint(value)
    except ValueError:
        choices = ", ".join(str(member.value) for member in hint)
        raise HealthConfigError(f"{where}: must be one of {choices}, got {value!r}") from None


def _scalar(hint: type, value: Any, where: str) -> Any:
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise HealthConfigError(f"{where}: expected {hint.__name__}, got {value!r}")


def validate(config: HealthConfig) -> None:
    """Range checks that types cannot express; raises :class:`HealthConfigError`."""
    positive = {
        "health.devices.tool_timeout_s": config.devices.tool_timeout_s,
        "health.storage.timeout_s": config.storage.timeout_s,
        "health.storage.probe_mb": config.storage.probe_mb,
        "health.storage.latency_ops": config.storage.latency_ops,
        "health.compute.matmul_size": config.compute.matmul_size,
        "health.compute.repeats": config.compute.repeats,
        "health.compute.bandwidth_mb": config.compute.bandwidth_mb,
        "health.compute.cpu_threads": config.compute.cpu_threads,
        "health.data.chunk_mb": config.data.chunk_mb,
        "health.fleet.mad_k": config.fleet.mad_k,
        "health.collectives.megabytes": config.collectives.megabytes,
        "health.collectives.iterations": config.collectives.iterations,
        "health.collectives.timeout_s": config.collectives.timeout_s,
        "health.node_timeout_s": config.node_timeout_s,
        "health.poll_interval_s": config.poll_interval_s,
    }
    for key, value in positive.items():
        if value <= 0:
            raise HealthConfigError(f"{key}: must be > 0, got {value}")
    if config.collectives.group_size < 2:
        raise HealthConfigError(
            f"health.collectives.group_size: must be >= 2 (a group of one has no link to test), "
            f"got {config.collectives.group_size}")
    fleet = config.fleet
    if not 0 < fleet.warn_relative <= fleet.exclude_relative < 1:
        raise HealthConfigError(
            "health.fleet: need 0 < warn_relative <= exclude_relative < 1, got "
            f"{fleet.warn_relative} and {fleet.exclude_relative}")
    if fleet.min_nodes < 3:
        raise HealthConfigError(
            f"health.fleet.min_nodes: must be >= 3 (two nodes cannot outvote each other), "
            f"got {fleet.min_nodes}")
    both = set(fleet.higher_is_better) & set(fleet.lower_is_better)
    if both:
        raise HealthConfigError(
            f"health.fleet: {sorted(both)[0]} is in both higher_is_better and "
            "lower_is_better; keep it in one")
    for i, mount in enumerate(config.storage.mounts):
        if not mount.path.startswith("/"):
            raise HealthConfigError(
                f"health.storage.mounts[{i}].path: must be an absolute path, got {mount.path!r}")
