"""The composed configuration of ``runmgr launch``: the trainer's sections
(model, optim, precision, data, training, parallel, checkpoint, device) plus
what only the driver needs (run, cluster, controller).

Every field has a docstring; unknown keys and wrong types fail when the
composed YAML is merged into :class:`RunConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from trainer.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainerConfig,
    TrainingConfig,
)

from health.config import HealthConfig, HealthConfigError, validate as validate_health
from runmgr.config.chaos import ChaosConfig
from runmgr.policy.config import PolicyConfig
from runmgr.watch.config import WatcherConfig

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class RunSection:
    """Identity and home of the run."""

    name: str = "run"
    """Run name; the run directory defaults to ``runs/<name>``."""
    number: int = 1
    """Run number: sub-runs are numbered ``<number>.00``, ``<number>.01``, ..."""
    dir: Optional[str] = None
    """Run directory (logbook, checkpoints, status); None means ``runs/<name>``."""

    def directory(self) -> Path:
        return Path(self.dir) if self.dir else Path("runs") / self.name


@dataclass
class ClusterConfig:
    """Where the ranks run."""

    address: Optional[str] = None
    """Ray cluster to join (``host:port`` of its GCS, or ``auto``); None starts a
    local Ray on this machine for the duration of the run."""
    num_workers: int = 2
    """Ranks (one Ray actor each): the world size."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per rank."""
    devices_per_worker: int = 0
    """Accelerators (Ray's GPU or NPU resource) reserved per rank."""
    placement_strategy: str = "PACK"
    """Ray placement-group strategy for the ranks' bundles."""
    local_nodes: int = 1
    """Local Ray only: Ray nodes started on this machine. With more than one,
    each node holds one rank's CPUs, and nodes beyond num_workers are spares
    that an excluded node's rank moves to (the demo shows node exclusion so)."""
    local_num_cpus: Optional[int] = None
    """Local Ray only: CPUs it advertises; None lets Ray count them (at least
    num_workers x cpus_per_worker are advertised so the demo fits)."""


@dataclass
class ControllerConfig:
    """The driver's loop and its budgets."""

    poll_interval_s: float = 0.2
    """How often the driver collects reports and checks the workers."""
    start_timeout_s: float = 180.0
    """Workers that are not placed and started within this time fail the launch."""
    worker_lease_s: float = 10.0
    """A worker that has not heard from its driver for this long stops itself
    (no orphans after a driver crash); a relaunch waits this long for them."""


@dataclass
class RunConfig:
    """Everything ``runmgr launch`` composes."""

    run: RunSection = field(default_factory=RunSection)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    device: str = "auto"
    """``auto``, ``cpu``, ``cuda`` or ``npu`` (see trainer/device.py)."""
    watcher: WatcherConfig = field(default_factory=WatcherConfig)
    """Detector thresholds (conf/watcher/default.yaml)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The remedy ladder and its budgets (conf/policy/default.yaml)."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Node health checks before launch and the device poll during it (conf/health/default.yaml)."""
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    """Faults injected into the run's real processes and inputs (conf/chaos/*.yaml; ``chaos=none``: off)."""

    @property
    def world_size(self) -> int:
        return self.cluster.num_workers

    def run_dir(self) -> Path:
        return self.run.directory()

    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.save) if self.checkpoint.save else self.run_dir() / "checkpoints"

    def trainer_config(self) -> TrainerConfig:
        """The trainer's view, with the checkpoint directory resolved."""
        checkpoint = CheckpointConfig(**{**vars(self.checkpoint), "save": str(self.checkpoint_dir().resolve())})
        return TrainerConfig(
            model=self.model, optim=self.optim, precision=self.precision, data=self.data,
            training=self.training, parallel=self.parallel, checkpoint=checkpoint, device=self.device,
        )

    def problems(self) -> list[str]:
        """Inconsistencies as one-line messages (empty when valid)."""
        out = []
        c = self.cluster
        if c.local_nodes <= 0:
            out.append(f"cluster.local_nodes must be a positive integer, got {c.local_nodes}")
        if c.num_workers <= 0:
            out.append(f"cluster.num_workers must be a positive integer, got {c.num_workers}")
        if c.cpus_per_worker < 0 or c.devices_per_worker < 0:
            out.append("cluster.cpus_per_worker and cluster.devices_per_worker must be >= 0")
        if c.placement_strategy not in PLACEMENT_STRATEGIES:
            out.append(f"cluster.placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, got {c.placement_strategy!r}")
        if self.controller.poll_interval_s <= 0:
            out.append(f"controller.poll_interval_s must be > 0, got {self.controller.poll_interval_s}")
        if self.controller.worker_lease_s < 20 * self.controller.poll_interval_s:
            out.append(f"controller.worker_lease_s ({self.controller.worker_lease_s}) must be at least 20 x "
                       f"controller.poll_interval_s ({self.controller.poll_interval_s}) so a busy driver is not taken for dead")
        if self.run.number < 0:
            out.append(f"run.number must be >= 0, got {self.run.number}")
        if not self.run.name or "/" in self.run.name:
            out.append(f"run.name must be a non-empty name without '/', got {self.run.name!r}")
        out += self.policy.problems()
        out += self.chaos.problems(self.training.train_iters)
        try:
            validate_health(self.health)
        except HealthConfigError as exc:
            out.append(str(exc))
        if out:
            return out
        return self.trainer_config().problems(self.world_size)
