"""The composed configuration of ``runmgr launch``: the trainer's sections
(every field of :class:`~trainer.config.TrainerConfig`, inherited) plus what
only the driver needs (run, cluster, controller, and the components' configs).

Every field has a docstring; unknown keys and wrong types fail when the
composed YAML is merged into :class:`RunConfig`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from trainer.config import TRAINER_SECTIONS, Choice, TrainerConfig
from trainer.megatron_args import without_megatron_flag

from health.config import HealthConfig, HealthConfigError, validate as validate_health
from runmgr.config.argv import flag_value
from runmgr.config.chaos import INPUT_KINDS, RANK_KINDS, ChaosConfig
from runmgr.config.kubernetes import KubernetesConfig
from runmgr.config.lint import LintConfig
from runmgr.config.megatron import MegatronConfig, TrainerKind, TrainerSection, save_dir
from runmgr.config.metrics import MetricsConfig
from runmgr.config.notify import NotifyConfig
from runmgr.config.numbers import number_problems
from runmgr.config.policy import PolicyConfig
from runmgr.config.rehearse import RehearseConfig
from runmgr.config.s3 import RunCheckpointConfig
from runmgr.config.typed import nested_problems
from runmgr.config.watcher import WatcherConfig

RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
"""A run name is one plain folder name under runs/: no '/', no '.' or '..', no
leading '.' or '-', no spaces, newlines or other characters a shell or a
path would change."""


class PlacementStrategy(Choice):
    """Ray placement-group strategies (the names Ray takes)."""

    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_PACK = "STRICT_PACK"
    STRICT_SPREAD = "STRICT_SPREAD"


@dataclass
class RunSection:
    """Identity and home of the run."""

    name: str = "run"
    """Run name; the run directory defaults to ``runs/<name>``. Letters, digits,
    '.', '_' and '-', starting with a letter, a digit or '_' (at most 128)."""
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
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK
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
    warm_spares: int = 0
    """Spare rank processes kept ready (model built, torch's first-step imports paid) beside
    the ranks: a rank lost to a fault is replaced by one, from a survivor's memory, while the
    survivors keep their processes (a warm restart: about a second; no step lost in plain
    data parallel, at most ``checkpoint.memory_interval`` under the other layouts). Needs
    ``checkpoint.memory_interval`` > 0 and the built-in trainer. 0: every restart is cold."""
    cluster_lost_timeout_s: float = 20.0
    """The Ray cluster's head (its GCS) silent for this long ends the sub-run as
    failed, with one line (a local head whose process exited: at once). Below
    Ray's own 60 s (``gcs_rpc_server_reconnect_timeout_s``), after which Ray
    ends the driver itself and nothing is recorded."""


RAY_GCS_RECONNECT_TIMEOUT_S = 60.0
"""Ray's default ``gcs_rpc_server_reconnect_timeout_s``: how long a driver waits for a
GCS that is gone before Ray ends its process."""


@dataclass
class RunConfig(TrainerConfig):
    """Everything ``runmgr launch`` composes: the trainer's sections
    (inherited from :class:`TrainerConfig`, so a section added there is a
    section here) and the driver's. Hand the trainer :meth:`trainer_config`,
    never this object: only that view has the checkpoint directory resolved."""

    checkpoint: RunCheckpointConfig = field(default_factory=RunCheckpointConfig)
    """Where and how often checkpoints are written, and their durable copy on S3 (``checkpoint.s3``)."""
    run: RunSection = field(default_factory=RunSection)
    """Name, number and directory of the run."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where the ranks run (conf/cluster/*.yaml)."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """The driver's loop and its budgets."""
    watcher: WatcherConfig = field(default_factory=WatcherConfig)
    """Detector thresholds (conf/watcher/default.yaml)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The remedy ladder and its budgets (conf/policy/default.yaml)."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Node health checks before launch and the device poll during it (conf/health/default.yaml)."""
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    """Faults injected into the run's real processes and inputs (conf/chaos/*.yaml; ``chaos=none``: off)."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """The driver's Prometheus exporter: on or off, and its address (conf/metrics/default.yaml)."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """Which trainer runs the ranks: the built-in one (default) or a Megatron job (``trainer.kind=megatron``)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """The Megatron-LM / MindSpeed-LLM job of ``trainer.kind=megatron``: flavor, script, args, env, ranks per node."""
    lint: LintConfig = field(default_factory=LintConfig)
    """``runmgr lint``'s rules at every launch: those silenced on purpose, the data sample (docs/lint.md)."""
    rehearse: RehearseConfig = field(default_factory=RehearseConfig)
    """The sizes of ``runmgr launch --rehearse``: this recipe small, on this machine (runmgr/rehearsal.py)."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """On KubeRay: replace an excluded node's worker pod (runmgr/config/kubernetes.py; k8s/ sets it)."""
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    """Webhooks told when the run needs a person (runmgr/config/notify.py; docs/notify.md)."""

    @property
    def world_size(self) -> int:
        return self.cluster.num_workers

    def run_dir(self) -> Path:
        return self.run.directory()

    @property
    def drives_megatron(self) -> bool:
        """True when the ranks are a Megatron job under torchrun (``trainer.kind=megatron``)."""
        return self.trainer.kind == TrainerKind.megatron

    def save_interval(self) -> Optional[int]:
        """Steps between two checkpoints: the Megatron job's ``--save-interval`` (None when its
        arguments have none), else ``checkpoint.save_interval``."""
        if self.drives_megatron:
            text = flag_value(self.megatron.args, "--save-interval")
            return int(text) if text is not None and text.isdigit() and int(text) > 0 else None
        return self.checkpoint.save_interval or None

    @property
    def job_describes_itself(self) -> bool:
        """True for a Megatron job with its own script or arguments: they, not this conf, say its
        model, batch, data and optimizer (runmgr reads them: runmgr/megatron/model.py)."""
        return self.drives_megatron and bool(self.megatron.script or self.megatron.args)

    def checkpoint_dir(self) -> Path:
        """Where the trainer saves. A Megatron job's own args say it (``--save``); derived args
        (no script, no args) carry this conf's, so the two never disagree."""
        saved_by_args = save_dir(self.megatron.args) if self.drives_megatron else None
        if saved_by_args:
            return Path(saved_by_args)
        return Path(self.checkpoint.save) if self.checkpoint.save else self.run_dir() / "checkpoints"

    def trainer_config(self) -> TrainerConfig:
        """The trainer's view, with the checkpoint directory resolved."""
        sections = {name: getattr(self, name) for name in TRAINER_SECTIONS}
        sections["checkpoint"] = self.checkpoint.for_trainer(save=str(self.checkpoint_dir().resolve()))
        return TrainerConfig(**sections)

    def problems(self, world_size: Optional[int] = None) -> list[str]:
        """Inconsistencies as one-line messages (empty when valid), for
        ``world_size`` ranks (default: cluster.num_workers). A consistent
        config the built-in trainer cannot execute (tensor parallel, ...) is
        no problem here, so that ``--dry-run`` plans it: ``launch`` refuses it
        through the plan's verdict (runmgr/dryrun.py)."""
        out = number_problems(self)  # NaN, infinities, huge integers: before any comparison lets them by
        if out:
            return out
        c = self.cluster
        if c.local_nodes <= 0:
            out.append(f"cluster.local_nodes must be a positive integer, got {c.local_nodes}")
        if c.num_workers <= 0:
            out.append(f"cluster.num_workers must be a positive integer, got {c.num_workers}")
        if c.cpus_per_worker < 0 or c.devices_per_worker < 0:
            out.append("cluster.cpus_per_worker and cluster.devices_per_worker must be >= 0")
        if c.local_num_cpus is not None and c.local_num_cpus <= 0:
            out.append(f"cluster.local_num_cpus must be a positive integer or null (Ray counts them), got {c.local_num_cpus}")
        if self.controller.start_timeout_s <= 0:
            out.append(f"controller.start_timeout_s must be > 0, got {self.controller.start_timeout_s}")
        if self.controller.poll_interval_s <= 0:
            out.append(f"controller.poll_interval_s must be > 0, got {self.controller.poll_interval_s}")
        if self.controller.worker_lease_s < 20 * self.controller.poll_interval_s:
            out.append(f"controller.worker_lease_s ({self.controller.worker_lease_s}) must be at least 20 x "
                       f"controller.poll_interval_s ({self.controller.poll_interval_s}) so a busy driver is not taken for dead")
        lost_s = self.controller.cluster_lost_timeout_s
        if not (math.isfinite(lost_s) and 0 < lost_s < RAY_GCS_RECONNECT_TIMEOUT_S):
            out.append(f"controller.cluster_lost_timeout_s must be a number of seconds > 0 and below "
                       f"{RAY_GCS_RECONNECT_TIMEOUT_S:.0f} (Ray ends a driver whose head stays silent that long), "
                       f"got {lost_s}")
        out += self._warm_problems()
        if self.run.number < 0:
            out.append(f"run.number must be >= 0, got {self.run.number}")
        if not RUN_NAME.fullmatch(self.run.name):
            out.append(f"run.name must be a plain name of letters, digits, '.', '_' and '-' that starts with a "
                       f"letter, a digit or '_' (at most 128 characters), got {self.run.name!r}")
        out += self.policy.problems()
        out += self.metrics.problems()
        out += self.lint.problems()
        out += self.rehearse.problems()
        out += self.checkpoint.s3.problems()
        out += self.kubernetes.problems()
        out += self.notify.problems()
        out += nested_problems(self.watcher, "watcher")
        out += self.chaos.problems(self.training.train_iters)
        try:
            validate_health(self.health)
        except HealthConfigError as exc:
            out.append(str(exc))
        out += self._trainer_problems(self.world_size if world_size is None else world_size)
        if out:
            return out
        if self.drives_megatron and self.megatron.args:
            return []  # the job's own arguments describe it; its script judges them at start
        return self.trainer_config().problems(self.world_size if world_size is None else world_size)

    def _warm_problems(self) -> list[str]:
        spares = self.controller.warm_spares
        if spares < 0:
            return [f"controller.warm_spares must be >= 0 (0: no warm restarts), got {spares}"]
        if spares and not self.checkpoint.memory_interval:
            return [f"controller.warm_spares={spares} needs in-memory snapshots to restore from: set "
                    f"checkpoint.memory_interval (e.g. 1), or controller.warm_spares=0"]
        if self.checkpoint.memory_interval > 0 and not spares:
            # Without a spare there is no warm restart: the kept state would serve nothing.
            return [f"checkpoint.memory_interval={self.checkpoint.memory_interval} keeps state for warm restarts, "
                    f"which need a ready spare: set controller.warm_spares=1, or checkpoint.memory_interval=0"]
        if spares and self.drives_megatron:
            return ["controller.warm_spares is for the built-in trainer (a Megatron job restarts as a whole under "
                    "torchrun): set controller.warm_spares=0"]
        return []

    def _trainer_problems(self, world_size: int) -> list[str]:
        """The ``trainer`` and ``megatron`` sections: a Megatron job runmgr can drive, or none set."""
        if not self.drives_megatron:
            if self.megatron != MegatronConfig():
                return ["megatron.* is set but trainer.kind is builtin: add trainer.kind=megatron or remove "
                        "the megatron settings"]
            return []
        out = self.megatron.problems(world_size)
        no_flag = without_megatron_flag(self)
        if no_flag:
            out.append(no_flag)
        if self.checkpoint.s3.enabled:
            out.append("checkpoint.s3 is not supported yet for trainer.kind=megatron: set checkpoint.s3.bucket=null")
        if self.megatron.script is not None or self.megatron.args:
            rewritten = sorted({str(fault.kind) for _, fault in self.chaos.of_kinds(INPUT_KINDS)})
            if rewritten:
                out.append(f"chaos faults {', '.join(rewritten)} rewrite this conf's data or LR, which reach the "
                           f"job only through the arguments runmgr derives (megatron.script and megatron.args "
                           f"unset): remove them (or chaos=none)")
        paused = sorted({str(fault.kind) for _, fault in self.chaos.of_kinds(RANK_KINDS)})
        if paused:
            out.append(f"chaos faults {', '.join(paused)} are carried out by the built-in trainer's reporter, which "
                       f"a Megatron job under torchrun does not have: remove them (or use trainer.kind=builtin)")
        return out
