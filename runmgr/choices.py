"""The words the parts share: what detectors report, how deaths are classed,
what the policy decides. Closed sets of strings, kept below config, watch and
policy so that each can name them.

Each member's name is its value, so YAML, JSON, OmegaConf (which reads an
enum by name) and plain string comparisons all see the same word (see
:class:`trainer.config.Choice`).
"""

from __future__ import annotations

from trainer.config import Choice  # the one str-enum base of the configs


class IncidentKind(Choice):
    """What a detector can report."""

    loss_spike = "loss_spike"
    grad_spike = "grad_spike"
    nonfinite = "nonfinite"
    loss_scale = "loss_scale"
    hang = "hang"
    straggler = "straggler"
    slowdown = "slowdown"
    device_fault = "device_fault"
    worker_death = "worker_death"
    launch_failure = "launch_failure"
    early_exit = "early_exit"
    """Every rank ended with exit code 0 before the run's last step (``--train-iters``):
    a job that stopped on its own, or never trained."""
    storage_outage = "storage_outage"
    """The durable tier (S3) fails every upload for longer than the watcher tolerates
    (OPT's "blob storage issues"); with ``recovered``, the end of one."""


class InstabilityKind(Choice):
    """Kinds met by the optimisation ladder (rollback, lower LR, reset Adam)."""

    loss_spike = "loss_spike"
    grad_spike = "grad_spike"
    nonfinite = "nonfinite"
    loss_scale = "loss_scale"


class DeathCategory(Choice):
    """What the policy maps to a remedy (policy.death_actions)."""

    hardware = "hardware"
    node = "node"
    network = "network"
    storage = "storage"
    io = "io"
    checkpoint = "checkpoint"
    memory = "memory"
    device = "device"
    killed = "killed"
    driver_lost = "driver_lost"
    config = "config"
    bug = "bug"
    rerun = "rerun"
    """Megatron's rerun state machine saved a checkpoint and exited 16: resume from it
    (preferably on another device) to tell a transient fault from a persistent one."""
    validation = "validation"
    """Megatron's rerun state machine rejected a result (exit 17, a tracker line): the
    device that produced it is suspect."""
    unknown = "unknown"


class Action(Choice):
    """What the policy can decide."""

    ignore = "ignore"
    rollback_skip = "rollback_skip"
    lower_lr = "lower_lr"
    lower_clip = "lower_clip"
    reset_optimizer = "reset_optimizer"
    exclude_node = "exclude_node"
    restart = "restart"
    dump_and_restart = "dump_and_restart"
    retry_launch = "retry_launch"
    keep_local = "keep_local"
    """Training goes on; checkpoints stay on the local disk until their durable copy verifies."""
    abort = "abort"


class LadderAction(Choice):
    """Rungs of the optimisation ladder; each rolls back to before the onset."""

    rollback_skip = "rollback_skip"
    lower_lr = "lower_lr"
    lower_clip = "lower_clip"
    reset_optimizer = "reset_optimizer"


class DeathAction(Choice):
    """What a worker death of a category may lead to (policy.death_actions)."""

    exclude_node = "exclude_node"
    restart = "restart"
    abort = "abort"
    reject_checkpoint = "reject_checkpoint"
    """Only for the ``checkpoint`` category: restart from the newest verified
    checkpoint older than the one the trainer found unusable."""


class SlowdownAction(Choice):
    """What a throughput drop may lead to (policy.slowdown_action)."""

    ignore = "ignore"
    restart = "restart"


class RestartPoint(Choice):
    """Where a restarting decision starts: ``step``, the checkpoint at its
    ``restart_from_step``; ``newest_at_restart``, the newest verified one when the
    restart happens (a fault: an async checkpoint that finishes after the decision
    is still used)."""

    step = "step"
    newest_at_restart = "newest_at_restart"
    memory = "memory"
    """A warm restart: the ranks' in-memory snapshot at ``restart_from_step``."""


class NotifyFormat(Choice):
    """The body a webhook is sent (runmgr/notify/sender.py)."""

    generic = "generic"
    slack = "slack"
