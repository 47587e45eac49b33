"""The remedy ladder and its budgets, mirrored by ``conf/policy/default.yaml``.

:func:`policy_config_from_dict` builds a :class:`PolicyConfig` from the
composed Hydra section and refuses unknown keys, wrong types and
inconsistent rungs with :class:`PolicyConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from runmgr.choices import Action, DeathAction, DeathCategory, InstabilityKind, LadderAction, SlowdownAction
from runmgr.config.typed import build
from runmgr.errors import ConfigError


class PolicyConfigError(ConfigError):
    """A policy setting is unknown, mistyped or inconsistent."""


@dataclass(frozen=True)
class RollbackConfig:
    """Where an instability rolls back to, and which data it skips (PaLM: restart ~100 steps
    before the spike, skip 200-500 batches)."""

    margin_steps: int = 100
    """Restart from the newest verified checkpoint at least this many steps before the onset."""
    skip_before_steps: int = 100
    """The skipped window starts this many steps' worth of samples before the onset..."""
    skip_after_steps: int = 200
    """...and ends this many steps' worth after it (300 batches in all by default)."""
    from_scratch_within_steps: int = 1000
    """When no verified checkpoint is old enough, an onset at or before this step rolls
    back to initialisation (a young run loses little: early divergence from a too-high LR
    is the usual case); a later one stops the run for a human. 0: always stop."""
    local_norms_after_steps: int = 50
    """The re-run after a rollback reports every weight's gradient norm on this many steps
    from its start (docs/local_norms.md), so that an instability that comes back shows the
    layer it enters by; 0: none. A Megatron job has no per-weight norms and ignores it."""

    def problems(self) -> list[str]:
        fields = (self.margin_steps, self.skip_before_steps, self.skip_after_steps, self.from_scratch_within_steps,
                  self.local_norms_after_steps)
        if min(fields) < 0:
            return ["margin_steps, skip_before_steps, skip_after_steps, from_scratch_within_steps and "
                    "local_norms_after_steps must be >= 0"]
        return []


@dataclass(frozen=True)
class Rung:
    """One rung of the instability ladder. Every rung rolls back; the rung says what changes."""

    action: LadderAction = LadderAction.rollback_skip
    """rollback_skip, lower_lr, lower_clip or reset_optimizer."""
    max_uses: int = 10
    """Budget: times this rung may be used in the run; one more stops the run for a human."""
    skip_data: bool = True
    """Add the data window around the onset to the plan's skip ranges."""
    lr_factor: float = 1.0
    """Multiplies the LR scale for the rest of the run (lower_lr; OPT 12.42-12.53 cut ~0.67-0.9 each time)."""
    clip_grad: Optional[float] = None
    """New clipping threshold for the rest of the run (lower_clip; OPT 12.16 went 1.0 -> 0.3)."""
    rewarmup_iters: int = 0
    """Linear warmup from 0 after the restart (reset_optimizer: a fresh warmup)."""

    def problems(self) -> list[str]:
        if self.max_uses < 0 or self.rewarmup_iters < 0 or not 0 < self.lr_factor <= 1:
            return ["need max_uses >= 0, rewarmup_iters >= 0 and 0 < lr_factor <= 1"]
        if self.action == LadderAction.lower_lr and self.lr_factor >= 1:
            return [f"a lower_lr rung needs lr_factor < 1, got {self.lr_factor}"]
        if self.action == LadderAction.lower_clip and (self.clip_grad is None or self.clip_grad <= 0):
            return [f"a lower_clip rung needs clip_grad > 0, got {self.clip_grad}"]
        return []


def _default_ladder() -> tuple[Rung, ...]:
    return (
        Rung(action=LadderAction.rollback_skip, max_uses=10, skip_data=True),
        Rung(action=LadderAction.lower_lr, max_uses=6, skip_data=True, lr_factor=0.67),
        Rung(action=LadderAction.reset_optimizer, max_uses=2, skip_data=True, rewarmup_iters=200),
    )


@dataclass(frozen=True)
class InstabilityConfig:
    """How spikes, divergence, NaN and loss-scale collapse are met."""

    kinds: tuple[InstabilityKind, ...] = tuple(InstabilityKind)
    """Incident kinds that climb the ladder (a recovered spike is only recorded)."""
    repeat_window_steps: int = 1000
    """An instability whose onset is within this many steps of the previous one's climbs a rung;
    one further away starts again at the first rung (the LR cuts stay)."""
    ladder: tuple[Rung, ...] = field(default_factory=_default_ladder)
    """Rung n answers the n-th instability in a row; past the last, the last rung repeats."""

    def problems(self) -> list[str]:
        if not self.ladder or self.repeat_window_steps < 0:
            return ["the ladder needs at least one rung and repeat_window_steps >= 0"]
        return []


@dataclass(frozen=True)
class RestartConfig:
    """Restarts after lost workers and hangs, and the storm breaker."""

    max_restarts: int = 20
    """Budget: restarts (worker deaths, hangs, exclusions) in the run."""
    storm_restarts: int = 3
    """Abort when this many restarts in a row started from the same checkpoint and never
    produced a newer one (a restart storm)."""
    max_launch_retries: int = 3
    """Budget: sub-runs whose workers could not be placed or started that are tried again
    (a node slow to come back is common); one more stops the run for a human."""
    launch_retry_wait_s: float = 30.0
    """Wait before each such retry."""

    def problems(self) -> list[str]:
        if self.max_restarts < 0 or self.storm_restarts < 1 or self.max_launch_retries < 0:
            return ["need max_restarts >= 0, storm_restarts >= 1 and max_launch_retries >= 0"]
        if not 0 <= self.launch_retry_wait_s < float("inf"):
            return [f"launch_retry_wait_s must be a finite number >= 0, got {self.launch_retry_wait_s}"]
        return []


@dataclass(frozen=True)
class HardwareConfig:
    """Taking nodes out."""

    max_excluded_nodes: int = 4
    """Budget: nodes excluded in the run; beyond that the fleet itself needs a human."""
    straggler_strikes: int = 3
    """A node reported as a straggler this many times within straggler_window_s is excluded."""
    straggler_window_s: float = 3600.0
    """Window of the straggler strikes."""

    def problems(self) -> list[str]:
        if self.max_excluded_nodes < 0 or self.straggler_strikes < 1 or self.straggler_window_s <= 0:
            return ["need max_excluded_nodes >= 0, straggler_strikes >= 1, straggler_window_s > 0"]
        return []


def _default_death_actions() -> dict[DeathCategory, DeathAction]:
    exclude, restart, abort = DeathAction.exclude_node, DeathAction.restart, DeathAction.abort
    category = DeathCategory
    return {category.hardware: exclude, category.node: exclude, category.network: restart,
            category.storage: exclude, category.io: restart, category.checkpoint: DeathAction.reject_checkpoint,
            category.memory: restart, category.device: restart, category.killed: restart,
            category.driver_lost: restart, category.config: abort, category.bug: abort,
            category.rerun: restart, category.validation: exclude, category.unknown: restart}


ALL_REMEDIES = "all"
NO_REMEDY = (Action.ignore.value, Action.abort.value, Action.retry_launch.value)
"""Decisions carried out whatever ``act_on`` says: no remedy (ignore, abort), or nothing running to go
on with while a person decides (retry_launch: the sub-run's ranks never started)."""


@dataclass(frozen=True)
class PolicyConfig:
    """The whole policy (Hydra group ``policy``)."""

    rollback: RollbackConfig = field(default_factory=RollbackConfig)
    instability: InstabilityConfig = field(default_factory=InstabilityConfig)
    restarts: RestartConfig = field(default_factory=RestartConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    death_actions: dict[DeathCategory, DeathAction] = field(default_factory=_default_death_actions)
    """Remedy per worker-death category: exclude_node, restart or abort. exclude_node falls
    back to restart when the node is unknown. ``checkpoint`` (the trainer found the checkpoint
    it resumed from unusable) may also be reject_checkpoint: restart from the newest verified
    checkpoint older than that one; no other category names a checkpoint to reject."""
    slowdown_action: SlowdownAction = SlowdownAction.ignore
    """ignore (record it) or restart a job that runs well below its own throughput baseline."""
    act_on: list[str] = field(default_factory=lambda: [ALL_REMEDIES])
    """The remedies runmgr carries out by itself (``all``: every one). Any other decision is a
    recommendation: recorded, told to the webhooks (``notify``), and the run goes on as it is until
    a person runs ``runmgr approve RUN`` (then carried out) or ``runmgr decline RUN`` (the run goes
    on as if it had not been decided). ``ignore`` and ``abort`` are no remedies: always done."""

    def carries_out(self, action: str) -> bool:
        """True when runmgr does ``action`` without asking a person."""
        return ALL_REMEDIES in self.act_on or action in self.act_on or action in NO_REMEDY

    def problems(self) -> list[str]:
        unknown = [name for name in self.act_on if name != ALL_REMEDIES and name not in Action.values()]
        if unknown:
            remedies = [a for a in Action.values() if a not in NO_REMEDY]
            return [f"policy.act_on: {unknown[0]!r} is no remedy; name some of {', '.join(remedies)} (or all)"]
        missing = [c for c in DeathCategory.values() if c not in self.death_actions]
        if missing:
            return [f"death_actions must name every category ({', '.join(DeathCategory.values())}); missing {missing[0]}"]
        misplaced = [c for c, action in self.death_actions.items()
                     if action == DeathAction.reject_checkpoint and c != DeathCategory.checkpoint]
        if misplaced:
            return [f"death_actions.{misplaced[0]}: reject_checkpoint is only for the checkpoint category "
                    f"(a {misplaced[0]} failure names no checkpoint); use exclude_node, restart or abort"]
        return []


def policy_config_from_dict(data: Any) -> PolicyConfig:
    """Build and check a :class:`PolicyConfig` from the composed ``policy`` section."""
    return build(PolicyConfig, data, "policy", PolicyConfigError)
