"""Thresholds of the detectors, mirrored by ``conf/watcher/default.yaml``.

Every field carries the reason for its default. :func:`watcher_config_from_dict`
builds a :class:`WatcherConfig` from the composed Hydra section and refuses
unknown keys or wrong types with :class:`WatcherConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from runmgr.errors import ConfigError
from runmgr.config.typed import build


class WatcherConfigError(ConfigError):
    """A watcher threshold is missing, unknown or out of range."""


@dataclass(frozen=True)
class SpikeConfig:
    """A robust z-score spike test of one metric against its own recent past."""

    window: int = 100
    """Observations in the rolling baseline (median and MAD); spike values stay out of it."""
    min_history: int = 20
    """Observations needed before the detector judges anything."""
    z_threshold: float = 6.0
    """Onset when the value exceeds the median by this many robust sigmas (MAD x 1.4826)..."""
    min_rise: float = 0.10
    """...and by at least this fraction of the median (noise-free traces must not fire on wobbles)."""
    recovery_z: float = 3.0
    """Back to normal when within this many robust sigmas of the baseline median..."""
    recovery_rise: float = 0.05
    """...or within this fraction of it, whichever is looser."""
    recovery_points: int = 2
    """Consecutive normal observations that count as recovered."""
    grace_steps: int = 50
    """A spike that recovers within this many steps of its onset is only recorded."""
    drift_rise: Optional[float] = 0.10
    """A slow divergence: the rolling median this fraction above its lowest value is reported at
    once (onset: where the lowest was reached). None disables it (gradient norms grow legitimately)."""

    def problems(self) -> list[str]:
        out = []
        if self.window < 3 or self.min_history < 3 or self.min_history > self.window:
            out.append(f"need 3 <= min_history ({self.min_history}) <= window ({self.window})")
        if self.z_threshold <= self.recovery_z:
            out.append(f"z_threshold ({self.z_threshold}) must exceed recovery_z ({self.recovery_z})")
        if self.min_rise < self.recovery_rise or self.recovery_rise < 0:
            out.append(f"need 0 <= recovery_rise ({self.recovery_rise}) <= min_rise ({self.min_rise})")
        if self.recovery_points < 1 or self.grace_steps < 1:
            out.append("recovery_points and grace_steps must be at least 1")
        if self.drift_rise is not None and self.drift_rise <= 0:
            out.append(f"drift_rise must be > 0 or null, got {self.drift_rise}")
        return out


def _grad_spike_defaults() -> SpikeConfig:
    # Gradient norms are heavier-tailed than the loss: only a tripling is a spike.
    return SpikeConfig(z_threshold=8.0, min_rise=2.0, recovery_z=4.0, recovery_rise=0.5, drift_rise=None)


@dataclass(frozen=True)
class LossScaleConfig:
    """fp16 dynamic loss scaling gone wrong (OPT's monitor: OVERFLOWING)."""

    window_iters: int = 20
    """Recent iterations judged together (OPT: the last 20 log lines)."""
    max_overflow_share: float = 0.25
    """Incident when more than this share of them were overflow-skipped (OPT: 25%)."""
    min_scale: float = 1.0
    """The scaler's floor (Megatron's --min-loss-scale default); reaching it is an incident."""

    def problems(self) -> list[str]:
        if self.window_iters < 1 or not 0 < self.max_overflow_share < 1:
            return [f"need window_iters >= 1 and 0 < max_overflow_share < 1, got "
                    f"{self.window_iters} and {self.max_overflow_share}"]
        return []


@dataclass(frozen=True)
class PhaseTimeout:
    """Bounds of one phase's learned heartbeat timeout, in seconds."""

    initial_s: float
    """Timeout before any duration of this phase was observed."""
    min_s: float
    """Never time out sooner (a fast phase must not turn a GC pause into a hang)."""
    max_s: float
    """Never wait longer (collectives time out at 600-1800 s; dump stacks before that)."""

    def problems(self) -> list[str]:
        if not 0 < self.min_s <= self.initial_s <= self.max_s:
            return [f"need 0 < min_s <= initial_s <= max_s, got {self.min_s}, {self.initial_s}, {self.max_s}"]
        return []


@dataclass(frozen=True)
class HangConfig:
    """Heartbeat timeouts per phase, learned from observed durations."""

    safety_factor: float = 5.0
    """Timeout = this x the longest recent duration of the phase, clamped to the phase's bounds."""
    history: int = 50
    """Recent durations remembered per phase."""
    init: PhaseTimeout = field(default_factory=lambda: PhaseTimeout(1800.0, 300.0, 3600.0))
    """Start-up: building the model, loading the checkpoint, forming the process group."""
    step: PhaseTimeout = field(default_factory=lambda: PhaseTimeout(600.0, 60.0, 1800.0))
    """One training step."""
    checkpoint: PhaseTimeout = field(default_factory=lambda: PhaseTimeout(1200.0, 120.0, 3600.0))
    """Writing a checkpoint (HPFS can be slow)."""
    eval: PhaseTimeout = field(default_factory=lambda: PhaseTimeout(1200.0, 120.0, 3600.0))
    """An evaluation pass (bigscience's hang happened here)."""

    def problems(self) -> list[str]:
        if self.safety_factor < 1 or self.history < 1:
            return [f"need safety_factor >= 1 and history >= 1, got {self.safety_factor} and {self.history}"]
        return []

    def bounds(self, phase: str) -> PhaseTimeout:
        """The bounds of ``phase`` (unknown phases get the step's)."""
        return getattr(self, phase) if phase in ("init", "step", "checkpoint", "eval") else self.step


@dataclass(frozen=True)
class StragglerConfig:
    """One rank persistently slower than its peers."""

    ratio: float = 1.25
    """A rank is slow at a step when its compute time exceeds the other ranks' median by this factor."""
    window: int = 20
    """Recent steps judged together."""
    min_share: float = 0.75
    """Incident when a rank was slow in at least this share of the window."""

    def problems(self) -> list[str]:
        if self.ratio <= 1 or self.window < 2 or not 0 < self.min_share <= 1:
            return [f"need ratio > 1, window >= 2, 0 < min_share <= 1, got {self.ratio}, {self.window}, "
                    f"{self.min_share}"]
        return []


@dataclass(frozen=True)
class SlowdownConfig:
    """The whole job slower than its own baseline (OPT 12.11)."""

    baseline_window: int = 200
    """Observations in the rolling throughput baseline (median)."""
    recent_window: int = 20
    """Observations whose median is compared with the baseline."""
    min_history: int = 50
    """Observations needed in the baseline before judging."""
    max_drop: float = 0.25
    """Incident when recent throughput is more than this fraction below the baseline."""

    def problems(self) -> list[str]:
        if not 1 <= self.recent_window <= self.min_history <= self.baseline_window or not 0 < self.max_drop < 1:
            return ["need 1 <= recent_window <= min_history <= baseline_window and 0 < max_drop < 1"]
        return []


@dataclass(frozen=True)
class DeviceConfig:
    """Which health-poll readings mean a device is faulty."""

    fault_statuses: tuple[str, ...] = ("Alarm", "Critical")
    """npu-smi health values that take a device out (Warning is only logged)."""
    max_uncorrectable: int = 0
    """Volatile uncorrectable ECC errors tolerated (OPT's UNCORRECT_THRESH = 0)."""
    max_correctable: int = 10000
    """Volatile correctable errors tolerated in total (OPT's CORRECT_THRESH)."""
    correctable_rise: int = 1000
    """Correctable errors gained within rise_window_s that count as fast-rising."""
    rise_window_s: float = 3600.0
    """Window of the correctable-rise test."""
    fatal_event_codes: tuple[int, ...] = (48, 64, 74, 79, 92, 95, 119, 120, 507053, 507054)
    """Event codes that take a device out (FORMATS.md 1.4, 2.3): Xid 48 double-bit ECC, 64 remap
    failure, 74 NVLink, 79 off the bus, 92 high single-bit rate, 95 uncontained ECC, 119/120 GSP;
    Ascend 507053 HBM UCE, 507054 HBM multi-bit ECC. Xid 94 (contained) only restarts the job."""

    def problems(self) -> list[str]:
        if self.max_uncorrectable < 0 or self.max_correctable < 0 or self.correctable_rise < 1:
            return ["ECC limits must be non-negative and correctable_rise at least 1"]
        return []


@dataclass(frozen=True)
class StorageConfig:
    """The durable tier (checkpoint.s3) failing: OPT's "blob storage issues"."""

    outage_after_s: float = 300.0
    """Uploads failing without a success for this long are an outage incident (a blip that
    a retry absorbs within it is not); the first success after it records the recovery."""

    def problems(self) -> list[str]:
        if self.outage_after_s <= 0:
            return [f"outage_after_s must be > 0, got {self.outage_after_s}"]
        return []


@dataclass(frozen=True)
class WatcherConfig:
    """All detector thresholds (Hydra group ``watcher``)."""

    enabled: bool = True
    """False runs no detector on step reports, heartbeats or device polls (no spike, hang,
    straggler, slowdown or ECC incident, so no rollback): only for measuring the watcher's own
    cost (bench/watcher_overhead.py). Worker deaths are still classified and restarted."""
    loss_spike: SpikeConfig = field(default_factory=SpikeConfig)
    """Spikes of the LM loss."""
    grad_spike: SpikeConfig = field(default_factory=_grad_spike_defaults)
    """Spikes of the global gradient norm."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    slowdown: SlowdownConfig = field(default_factory=SlowdownConfig)
    devices: DeviceConfig = field(default_factory=DeviceConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Uploads of the checkpoints' durable copies (checkpoint.s3)."""


def watcher_config_from_dict(data: Any) -> WatcherConfig:
    """Build and check a :class:`WatcherConfig` from the composed ``watcher`` section."""
    return build(WatcherConfig, data, "watcher", WatcherConfigError)
