"""Rules for systems faults: hangs, worker deaths, device faults, stragglers,
slowdowns, and sub-runs whose workers could not be started.

All restart from the newest verified checkpoint at restart time (no margin:
nothing is wrong with the weights), spend the restart budget and pass the
storm breaker; a checkpoint the trainer found unusable is rejected instead:
the restart starts from the newest verified checkpoint older than it.
Hardware takes the node out first (OPT drained nodes with ECC errors, lost
GPUs and bad links), within the exclusion budget. When the nodes
left hold fewer ranks, the decision resizes data parallel; a failed launch is
retried after a wait within its own budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from runmgr.choices import DeathAction, RestartPoint
from runmgr.policy.capacity import Capacity, fit_world
from runmgr.policy.checkpoints import VerifiedCheckpoint, newest, newest_at_or_before
from runmgr.config.policy import PolicyConfig
from runmgr.policy.decision import (
    ABORT, DUMP_AND_RESTART, EXCLUDE_NODE, IGNORE, RESTART, RETRY_LAUNCH, Action, Decision,
)
from runmgr.policy.guards import storm_abort
from runmgr.policy.history import History
from runmgr.policy.replacement import plan_replacement
from runmgr.policy.warm import WarmCover, WarmVerdict, warm_verdict
from runmgr.watch.incidents import (
    DEVICE_FAULT, EARLY_EXIT, HANG, LAUNCH_FAILURE, SLOWDOWN, STRAGGLER, WORKER_DEATH, Incident,
)


@dataclass(frozen=True)
class FaultContext:
    """What every fault rule reads besides the incident."""

    history: History
    config: PolicyConfig
    checkpoints: Sequence[VerifiedCheckpoint]
    capacity: Optional[Capacity]
    """What the cluster can hold now; None (a replay) keeps the data-parallel size."""
    warm: Optional[WarmCover] = None
    """What the worker group could recover warm now; None: it keeps no warm state."""


QUOTED_CHARS = 160
"""A job's line quoted in a reason, at most (the incident's evidence keeps it whole)."""
WARM_KINDS = frozenset({WORKER_DEATH, DEVICE_FAULT, STRAGGLER})
"""Faults whose restart may be warm: a dead or excluded rank is replaced and the others go on.
A hang restarts cold (a hung rank cannot be joined, and gloo has no abort); so does a
slowdown (restarting everything is the remedy) and a failed launch (nothing is running)."""


def decide_fault(incident: Incident, history: History, config: PolicyConfig,
                 checkpoints: Sequence[VerifiedCheckpoint], capacity: Optional[Capacity] = None,
                 warm: Optional[WarmCover] = None) -> Decision:
    """The decision for a non-instability incident; ``warm``: what the worker group could
    recover warm now (None: nothing)."""
    ctx = FaultContext(history, config, checkpoints, capacity, warm)
    if incident.kind == HANG:
        return _hang(incident, ctx)
    if incident.kind == EARLY_EXIT:
        return _early_exit(incident, ctx)
    if incident.kind == WORKER_DEATH:
        return _death(incident, ctx)
    if incident.kind == DEVICE_FAULT:
        return _exclude(incident, ctx, incident.nodes)
    if incident.kind == STRAGGLER:
        return _straggler(incident, ctx)
    if incident.kind == LAUNCH_FAILURE:
        return _launch_failure(incident, ctx)
    if incident.kind == SLOWDOWN:
        if config.slowdown_action == RESTART:
            return _restart(incident, ctx, RESTART, "restart the job")
        return Decision(IGNORE, f"recorded: {_context(incident)} (policy.slowdown_action is ignore)")
    raise ValueError(f"no policy rule for incident kind {incident.kind!r}")


def _hang(incident: Incident, ctx: FaultContext) -> Decision:
    """A hung sub-run restarts after its stacks are dumped; a job that never printed a step and
    hangs at its start needs a person at once (a restart starts it the same way)."""
    silent = incident.evidence.get("silent") or [{}]
    if incident.evidence.get("never_stepped") and silent[0].get("phase") == "init":
        return Decision(ABORT, (
            f"{_context(incident)}: the job has not printed a single iteration line since it started, in this "
            f"sub-run or any before it; a restart would start it the same way. A human must look at its "
            f"start-up: {_output_note(incident)}; the stacks of every rank are dumped beside the logbook"),
            dump_stacks=True)
    return _restart(incident, ctx, DUMP_AND_RESTART, "dump every rank's stack, kill the workers and restart")


def _early_exit(incident: Incident, ctx: FaultContext) -> Decision:
    """Every rank exited 0 before the last step. A job that saved a newer checkpoint first
    stopped by itself on purpose (Megatron's --exit-interval, --exit-duration-in-mins, its
    signal handler): go on from what it saved. One that saved nothing new never trained, or
    stopped without a trace: a person looks (restarting it repeats it)."""
    evidence = incident.evidence
    if evidence.get("saved_since_start"):
        return _restart(incident, ctx, RESTART, f"start it again from what it saved (it stopped by itself, as "
                                                f"Megatron's --exit-interval or --exit-duration-in-mins do)")
    return Decision(ABORT, (
        f"{_context(incident)}: it saved no checkpoint newer than step {evidence.get('start_step')} before it "
        f"ended, so a restart would repeat it. A human must look at why the job stopped: "
        f"{_output_note(incident)}"))


def _output_note(incident: Incident) -> str:
    """The job's last line, quoted (the logbook's incident keeps the last lines of each node)."""
    lines = [line for line in incident.evidence.get("last_output", ()) if line.strip()]
    if not lines:
        return "it printed nothing"
    last = lines[-1].strip()
    quoted = last if len(last) <= QUOTED_CHARS else last[:QUOTED_CHARS] + "..."
    return f"its last line was \"{quoted}\" (the incident keeps the last lines of each node)"


def _death(incident: Incident, ctx: FaultContext) -> Decision:
    category = str(incident.evidence.get("category", "unknown"))
    action = ctx.config.death_actions.get(category, RESTART)  # type: ignore[call-overload]
    if action == ABORT:
        hint = incident.evidence.get("hint", "the worker's log")
        line = incident.evidence.get("line")
        said = f"; it said: \"{line}\"" if line else ""
        return Decision(ABORT, f"{_context(incident)}: a {category} failure does not go away by restarting "
                               f"(policy.death_actions.{category} = abort); a human must look at {hint}{said}")
    if action == EXCLUDE_NODE and incident.nodes:
        return _exclude(incident, ctx, incident.nodes)
    if action == DeathAction.reject_checkpoint and incident.evidence.get("checkpoint_step", -1) >= 0:
        return _reject_checkpoint(incident, ctx)
    return _restart(incident, ctx, RESTART,
                    f"restart the workers ({category} failure, on the same or replacement workers)")


def _reject_checkpoint(incident: Incident, ctx: FaultContext) -> Decision:
    """The trainer found the checkpoint the incident names unusable: restarting from it
    would fail the same way, so restart from the newest verified one older than it
    (within the restart budget and the storm breaker), or from initialisation while the
    run is young (as a rollback would)."""
    bad, bad_step = incident.evidence["checkpoint"], int(incident.evidence["checkpoint_step"])
    older = newest_at_or_before(ctx.checkpoints, bad_step - 1)
    scratch = ctx.config.rollback.from_scratch_within_steps
    if older is None and bad_step > scratch:
        return Decision(ABORT, (
            f"{_context(incident)}: checkpoint {bad} is unusable and no verified checkpoint is older; starting "
            f"again from initialisation would lose {bad_step} steps (policy.rollback.from_scratch_within_steps "
            f"is {scratch}). A human must look at the run's checkpoints"))
    where = (f"the newest verified checkpoint before it (step {older.step})" if older
             else "initialisation (no verified checkpoint before it)")
    return _restart(incident, ctx, RESTART, f"reject checkpoint {bad} and restart the workers",
                    origin=_Origin(older, RestartPoint.step, where))


def _straggler(incident: Incident, ctx: FaultContext) -> Decision:
    hw = ctx.config.hardware
    counts = {node: ctx.history.strikes(STRAGGLER, node, incident.time, hw.straggler_window_s) + 1
              for node in incident.nodes}
    repeat = tuple(node for node, count in counts.items() if count >= hw.straggler_strikes)
    tally = ", ".join(f"{node}: strike {count} of {hw.straggler_strikes}" for node, count in counts.items())
    if not repeat:
        return Decision(IGNORE, f"recorded ({tally or 'no node known'} within "
                                f"{hw.straggler_window_s:.0f} s): {_context(incident)}")
    return _exclude(incident, ctx, repeat, note=f" ({tally})")


def _exclude(incident: Incident, ctx: FaultContext, nodes: Sequence[str], note: str = "") -> Decision:
    excluded = ctx.history.excluded_nodes()
    fresh = tuple(node for node in nodes if node not in excluded)
    if not fresh:
        return Decision(IGNORE, f"recorded: {_context(incident)}; {', '.join(nodes) or 'no node named'} "
                                f"already excluded")
    limit = ctx.config.hardware.max_excluded_nodes
    if len(excluded) + len(fresh) > limit:
        return Decision(ABORT, (
            f"{_context(incident)}: excluding {', '.join(fresh)} would take {len(excluded) + len(fresh)} nodes "
            f"out (budget {limit}; already out: {', '.join(excluded) or 'none'}). A human must look at the "
            f"fleet's health (runmgr health-check) before more nodes go"))
    return _restart(incident, ctx, EXCLUDE_NODE,
                    f"exclude {', '.join(fresh)}{note} and restart on the remaining nodes or a spare", exclude=fresh)


def _launch_failure(incident: Incident, ctx: FaultContext) -> Decision:
    """Workers that could not be placed or started: try again after a wait (a node slow
    to come back), or at once on fewer ranks when the nodes left hold fewer; within
    policy.restarts.max_launch_retries."""
    restarts = ctx.config.restarts
    used, limit = ctx.history.uses(RETRY_LAUNCH), restarts.max_launch_retries
    error = incident.evidence.get("error", incident.description)
    if used >= limit:
        return Decision(ABORT, (
            f"the workers of sub-run {incident.subrun} could not be started: {error}; the launch-retry budget is "
            f"spent ({used} of {limit}). A human must look at the cluster (`ray status`, the nodes' health)"))
    start = newest(ctx.checkpoints)
    origin = _origin(start)
    if incident.evidence.get("warm"):
        # The spares or the peers' memory failed mid-recovery: the survivors' state went with the
        # group, and nothing suggests a node is slow to come back.
        return Decision(
            RETRY_LAUNCH, (f"the warm restart of sub-run {incident.subrun} failed ({error}) -> restart cold now "
                           f"from {origin} (retry {used + 1} of {limit})"),
            restart_from_step=start.step if start else None, restart_point="newest_at_restart")
    wait, size, note = restarts.launch_retry_wait_s, None, ""
    if ctx.capacity is not None:
        resize = fit_world(ctx.capacity, ctx.history.excluded_nodes())
        if resize.size is not None and resize.size < ctx.capacity.current:
            wait, size, note = 0.0, resize.size, f"; {resize.note}"
        elif resize.size is None:
            note = f"; {resize.note}, so wait for nodes to come back"
    when = f"in {wait:g} s" if wait else "now"
    return Decision(
        RETRY_LAUNCH, (f"the workers of sub-run {incident.subrun} could not be started ({error}){note} -> try again "
                       f"{when} from {origin} (retry {used + 1} of {limit})"),
        restart_from_step=start.step if start else None, restart_point="newest_at_restart",
        data_parallel_size=size, wait_s=wait)


def _origin(start: Optional[VerifiedCheckpoint]) -> str:
    if start is None:
        return "initialisation (no verified checkpoint yet)"
    return f"the newest verified checkpoint at restart time (step {start.step} now)"


@dataclass(frozen=True)
class _Origin:
    """Where a restart starts, when not from the newest verified checkpoint at restart time."""

    checkpoint: Optional[VerifiedCheckpoint]
    """None: from initialisation."""
    point: RestartPoint
    words: str


def _restart(incident: Incident, ctx: FaultContext, action: Action, what: str,
             exclude: tuple[str, ...] = (), origin: Optional[_Origin] = None) -> Decision:
    history, config, checkpoints = ctx.history, ctx.config, ctx.checkpoints
    used, limit = history.fault_restarts(), config.restarts.max_restarts
    if used >= limit:
        return Decision(ABORT, (
            f"{_context(incident)}: the restart budget is spent ({used} of {limit} restarts for deaths, hangs "
            f"and exclusions). A human must look at why the run keeps failing: "
            f"{incident.evidence.get('hint', 'the incidents in the logbook')}"))
    storm = storm_abort(incident, history, config, checkpoints)
    if storm is not None:
        return storm
    verdict = _warm_verdict(incident, ctx, action, exclude, origin)
    if verdict is not None and verdict.warm:
        assert ctx.warm is not None  # a warm verdict needs a cover
        return Decision(
            action, f"{_context(incident)} -> {what}; {verdict.note} (restart {used + 1} of {limit})",
            restart_from_step=ctx.warm.snapshot_step, restart_point=RestartPoint.memory, exclude_nodes=exclude,
            warm=True, replace_ranks=verdict.lost_ranks)
    cold_note = f"; {verdict.note}" if verdict is not None else ""
    size, resize_note, replacement = None, "", None
    if ctx.capacity is not None:
        avoid = (*history.excluded_nodes(), *exclude)
        replacement = plan_replacement(ctx.capacity, avoid, exclude)
        resize = fit_world(replacement.capacity, avoid)
        if resize.size is None:
            return Decision(ABORT, (f"{_context(incident)}: no room to restart: {resize.note}. A human must add "
                                    f"nodes or bring lost ones back (excluded: {', '.join(avoid) or 'none'})"))
        size, resize_note = resize.size, (f"; {resize.note}" if resize.note else "") + replacement.note
    if origin is None:
        start = newest(checkpoints)
        origin = _Origin(start, RestartPoint.newest_at_restart, _origin(start))
    return Decision(
        action, (f"{_context(incident)} -> {what}{resize_note}, from {origin.words}{cold_note} "
                 f"(restart {used + 1} of {limit})"),
        restart_from_step=origin.checkpoint.step if origin.checkpoint else None, restart_point=origin.point,
        exclude_nodes=exclude, dump_stacks=action == DUMP_AND_RESTART, data_parallel_size=size,
        **(replacement.decision_fields() if replacement is not None else {}),
    )


def _warm_verdict(incident: Incident, ctx: FaultContext, action: Action, exclude: tuple[str, ...],
                  origin: Optional[_Origin]) -> Optional[WarmVerdict]:
    """Warm or cold for a restart of the group that keeps warm state (None: it keeps none,
    or the restart is not one a warm path can serve: a hang, a slowdown, a rejected checkpoint)."""
    if ctx.warm is None:
        return None
    if incident.kind not in WARM_KINDS or action not in (RESTART, EXCLUDE_NODE) or origin is not None:
        return WarmVerdict(False, f"cold: a {incident.kind} restarts every rank")
    latest = newest(ctx.checkpoints)
    return warm_verdict(ctx.warm, incident.ranks, exclude, ctx.history.excluded_nodes(),
                        latest.step if latest else None)


def _context(incident: Incident) -> str:
    """What happened, in the few numbers a reason needs."""
    evidence = incident.evidence
    nodes = f" on {', '.join(incident.nodes)}" if incident.nodes else ""
    ranks = ", ".join(str(r) for r in incident.ranks) or "?"
    if incident.kind == HANG and evidence.get("silent"):
        first = evidence["silent"][0]
        return (f"rank(s) {ranks}{nodes} silent for {first['silent_s']:.0f} s in phase {first['phase']} at step "
                f"{first['step']} (timeout {first['timeout_s']:.0f} s)")
    if incident.kind == WORKER_DEATH:
        return f"rank {ranks}{nodes} died of {evidence.get('cause')} ({evidence.get('category')})"
    if incident.kind == DEVICE_FAULT:
        return f"device fault {evidence.get('reason')}{nodes}, device {evidence.get('device')}"
    if incident.kind == SLOWDOWN:
        return (f"throughput {evidence.get('drop', 0):.0%} below the run's baseline "
                f"(threshold {evidence.get('max_drop', 0):.0%})")
    if incident.kind == EARLY_EXIT:
        return (f"every rank exited 0 at step {evidence.get('last_step')} of {evidence.get('final_step')} "
                f"({evidence.get('steps_reported', 0)} iteration line(s) in this sub-run)")
    return f"{incident.kind} of rank(s) {ranks}{nodes}"
