"""What the policy returns: an action, its reason, and the plan changes as data.

The policy only decides (like Ray Train v2's FailurePolicy); the controller
executes. The plan changes are plain data that :func:`runmgr.policy.plan_update.next_plan`
folds into the next sub-run's :class:`trainer.plan.ResumePlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Optional

from runmgr.choices import Action, LadderAction, RestartPoint
from trainer.plan import SkipRange

IGNORE: Final = Action.ignore
ROLLBACK_SKIP: Final = Action.rollback_skip
LOWER_LR: Final = Action.lower_lr
LOWER_CLIP: Final = Action.lower_clip
RESET_OPTIMIZER: Final = Action.reset_optimizer
EXCLUDE_NODE: Final = Action.exclude_node
RESTART: Final = Action.restart
DUMP_AND_RESTART: Final = Action.dump_and_restart
RETRY_LAUNCH: Final = Action.retry_launch
KEEP_LOCAL: Final = Action.keep_local
ABORT: Final = Action.abort

ACTIONS: tuple[str, ...] = Action.values()
INSTABILITY_ACTIONS = frozenset(LadderAction.values())
"""Rungs of the optimisation ladder; each rolls back to before the onset."""
RESTARTING_ACTIONS = INSTABILITY_ACTIONS | {EXCLUDE_NODE, RESTART, DUMP_AND_RESTART, RETRY_LAUNCH}
"""Actions that end the current sub-run (or its failed launch) and start a new one."""


@dataclass(frozen=True)
class Decision:
    """The policy's answer to one incident."""

    action: Action
    """What to do."""
    reason: str
    """Why, quoting the numbers (incident figures, checkpoint, budgets)."""
    restart_from_step: Optional[int] = None
    """Step of the verified checkpoint to start from; None with a restarting action means
    from initialisation (no verified checkpoint yet). With ``restart_point``
    ``newest_at_restart`` it is the newest one when the decision was taken."""
    restart_point: RestartPoint = RestartPoint.step
    """``step``: exactly the checkpoint at ``restart_from_step``; ``newest_at_restart``: the
    newest verified checkpoint at restart time, up to the last step the driver recorded."""
    skip_ranges: tuple[SkipRange, ...] = ()
    """Sample ranges to add to the plan's skip list."""
    lr_factor: float = 1.0
    """Multiplies the plan's LR scale, for the rest of the run."""
    clip_grad: Optional[float] = None
    """New gradient-clipping threshold, kept for the rest of the run; None keeps the current one."""
    reset_optimizer: bool = False
    """Start Adam's moments afresh at the restart (weights are kept)."""
    rewarmup_iters: int = 0
    """Linear re-warmup after the restart (with reset_optimizer: OPT 12.16's fresh warmup)."""
    exclude_nodes: tuple[str, ...] = ()
    """Nodes to take out of the placement before restarting."""
    dump_stacks: bool = False
    """Dump every rank's Python stack (py-spy) before killing it."""
    data_parallel_size: Optional[int] = None
    """Data-parallel size of the next sub-run (a resize is a decision: the nodes left hold
    fewer ranks); None keeps the current plan's."""
    wait_s: float = 0.0
    """Seconds to wait before the next sub-run starts (a node slow to come back)."""
    local_norms_steps: tuple[int, ...] = ()
    """Steps of the next sub-run on which the trainer reports every weight's gradient norm
    (a rollback's re-run: where a returning instability enters)."""
    warm: bool = False
    """A warm restart (runmgr/policy/warm.py): the surviving ranks keep their state in memory
    and ``replace_ranks`` start on ready spares from a peer's in-memory snapshot at
    ``restart_from_step``; the sub-run's workers are not stopped."""
    replace_ranks: tuple[int, ...] = ()
    """The ranks a warm restart replaces (the dead ones and every rank of an excluded node)."""
    replace_nodes: tuple[str, ...] = ()
    """Excluded nodes whose pods the executor asks the cluster to replace (KubeRay deletes the
    pod and starts a new one elsewhere: the worker group keeps its replica count)."""
    await_ranks: int = 0
    """Ranks the usable nodes must hold again (the replacements up) before the next sub-run
    starts; 0: start at once. The executor waits at most ``await_timeout_s``."""
    await_timeout_s: float = 0.0
    """The longest wait for ``await_ranks``; past it the sub-run starts with what is there
    (a launch that cannot place its ranks is a launch failure, decided as such)."""
    awaits_approval: bool = False
    """``policy.act_on`` does not name this remedy: the executor holds it until a person approves
    it (``runmgr approve``: carried out as decided) or declines it (the run goes on)."""

    @property
    def restarts(self) -> bool:
        """True when the decision ends the sub-run and starts a new one."""
        return self.action in RESTARTING_ACTIONS

    def to_dict(self) -> dict:
        """Plain data for JSON and the logbook."""
        return {
            "action": self.action,
            "reason": self.reason,
            "restart_from_step": self.restart_from_step,
            "skip_ranges": [[r.start, r.end] for r in self.skip_ranges],
            "lr_factor": self.lr_factor,
            "clip_grad": self.clip_grad,
            "reset_optimizer": self.reset_optimizer,
            "rewarmup_iters": self.rewarmup_iters,
            "exclude_nodes": list(self.exclude_nodes),
            "dump_stacks": self.dump_stacks,
            "restart_point": self.restart_point,
            "data_parallel_size": self.data_parallel_size,
            "wait_s": self.wait_s,
            "local_norms_steps": list(self.local_norms_steps),
            "warm": self.warm,
            "awaits_approval": self.awaits_approval,
            "replace_ranks": list(self.replace_ranks),
            "replace_nodes": list(self.replace_nodes),
            "await_ranks": self.await_ranks,
            "await_timeout_s": self.await_timeout_s,
        }


def held_for_approval(decision: Decision, carries_out) -> Decision:
    """``decision``, held for a person's approval when ``carries_out(action)`` says runmgr does not
    take that remedy by itself (``policy.act_on``)."""
    if carries_out(decision.action):
        return decision
    return replace(decision, awaits_approval=True,
                   reason=f"{decision.reason}; held for a person (policy.act_on does not name {decision.action}): "
                          f"`runmgr approve RUN` carries it out, `runmgr decline RUN` goes on without it")
